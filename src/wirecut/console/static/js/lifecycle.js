// The lifecycle of one command's block, as data: every state, event and transition.
//
// Like the runner's (src/wirecut/console/runner/_lifecycle.py, after h11's
// _state.py), the table below is the only place that says which state follows
// which, and `transition` the only function that decides it. An event that the
// table does not allow in the current state throws a LifecycleError naming the
// command, the state and the event: a bug in the page, never something the
// server can make happen by following docs/protocol.md.
//
//   SENDING ──accepted──▶ RUNNING ──confirm_required──▶ CONFIRM ──confirmed──┐
//      │  └──queued──▶ QUEUED ──started──▶ RUNNING ◀───────────────────────────┘
//      └──refused──▶ ERROR          (any live state) ──cancel──▶ CANCELLING
//   (any live state) ──complete_<status>──▶ OK | ERROR | CANCELLED | TIMEOUT
//   (any live state) ──disconnected──▶ CANCELLED

export class LifecycleError extends Error {
  constructor(id, state, event) {
    super(`command ${JSON.stringify(id)}: event "${event}" is not allowed in state "${state}"`);
    this.name = "LifecycleError";
  }
}

/** A block's states; the values are what `data-state` and the stylesheet use. */
export const CommandState = Object.freeze({
  SENDING: "sending", // the run frame is out; no answer yet
  QUEUED: "queued", // accepted; every worker is busy
  RUNNING: "running", // accepted and running (or about to)
  CONFIRM: "confirm", // it asked confirm_required; the dialog holds the answer
  CANCELLING: "cancelling", // this page sent a cancel; its complete is on its way
  OK: "ok", // complete: ok
  ERROR: "error", // complete: error, or the run was refused
  CANCELLED: "cancelled", // complete: cancelled, or the connection closed under it
  TIMEOUT: "timeout", // complete: timeout
});

/** What happens to a block: a frame from the server, or the person's doing. */
export const CommandEvent = Object.freeze({
  ACCEPTED: "accepted", // `accepted` with queued false
  QUEUED: "queued", // `accepted` with queued true
  STARTED: "started", // `started`
  CONFIRM_REQUIRED: "confirm_required", // `confirm_required`
  CONFIRMED: "confirmed", // the person confirmed; `confirm` was sent
  CANCEL: "cancel", // this page sent `cancel` (button, Esc, decline, cancel all)
  REFUSED: "refused", // an `error` before `accepted`: the run was refused, no complete comes
  DISCONNECTED: "disconnected", // the connection closed: the server cancelled it
  COMPLETE_OK: "complete_ok",
  COMPLETE_ERROR: "complete_error",
  COMPLETE_CANCELLED: "complete_cancelled",
  COMPLETE_TIMEOUT: "complete_timeout",
});

const S = CommandState;
const E = CommandEvent;

/** The states in which the server still owes the command its `complete`. */
export const LIVE_STATES = new Set([S.SENDING, S.QUEUED, S.RUNNING, S.CONFIRM, S.CANCELLING]);

const ENDINGS = [
  [E.COMPLETE_OK, S.OK],
  [E.COMPLETE_ERROR, S.ERROR],
  [E.COMPLETE_CANCELLED, S.CANCELLED],
  [E.COMPLETE_TIMEOUT, S.TIMEOUT],
  [E.DISCONNECTED, S.CANCELLED],
];

function row(own) {
  return new Map([...own, ...ENDINGS]);
}

/** state -> (event -> next state). Nothing else moves a block. */
export const TRANSITIONS = new Map([
  [S.SENDING, row([
    [E.ACCEPTED, S.RUNNING],
    [E.QUEUED, S.QUEUED],
    [E.CANCEL, S.CANCELLING],
    [E.REFUSED, S.ERROR],
  ])],
  [S.QUEUED, row([
    [E.STARTED, S.RUNNING],
    [E.CANCEL, S.CANCELLING],
  ])],
  [S.RUNNING, row([
    [E.STARTED, S.RUNNING], // `accepted` (not queued) already showed it running
    [E.CONFIRM_REQUIRED, S.CONFIRM],
    [E.CANCEL, S.CANCELLING],
  ])],
  [S.CONFIRM, row([
    [E.CONFIRMED, S.RUNNING],
    [E.CANCEL, S.CANCELLING],
  ])],
  [S.CANCELLING, row([
    // News that crossed the cancel on the wire changes nothing: the complete decides.
    [E.ACCEPTED, S.CANCELLING],
    [E.QUEUED, S.CANCELLING],
    [E.STARTED, S.CANCELLING],
    [E.CONFIRM_REQUIRED, S.CANCELLING],
    [E.CANCEL, S.CANCELLING], // a second cancel (cancel all after Esc): the first stays
    [E.REFUSED, S.ERROR],
  ])],
  // OK, ERROR, CANCELLED, TIMEOUT: final, nothing follows a complete.
  [S.OK, new Map()],
  [S.ERROR, new Map()],
  [S.CANCELLED, new Map()],
  [S.TIMEOUT, new Map()],
]);

/** The event of a `complete` frame's status (a status this page does not know reads as error). */
export function completeEvent(status) {
  return {
    ok: E.COMPLETE_OK,
    error: E.COMPLETE_ERROR,
    cancelled: E.COMPLETE_CANCELLED,
    timeout: E.COMPLETE_TIMEOUT,
  }[status] || E.COMPLETE_ERROR;
}

/** The state after `event` in `state`, or a LifecycleError naming command `id`. */
export function transition(id, state, event) {
  const next = TRANSITIONS.get(state)?.get(event);
  if (next === undefined) throw new LifecycleError(id, state, event);
  return next;
}

export function isLive(state) {
  return LIVE_STATES.has(state);
}

/** What a block's badge (and its chip in the strip) says in each state. */
export const BADGE_TEXT = Object.freeze({
  [S.SENDING]: "sending",
  [S.QUEUED]: "queued",
  [S.RUNNING]: "running",
  [S.CONFIRM]: "confirm?",
  [S.CANCELLING]: "cancelling…",
  [S.OK]: "ok",
  [S.ERROR]: "error",
  [S.CANCELLED]: "cancelled",
  [S.TIMEOUT]: "timed out",
});
