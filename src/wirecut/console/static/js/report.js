// What a finished block says: the facts of its `complete` in one line, and the
// unwind timeline drawn as a waterfall (docs/web-console.md, "What a cancelled
// block says").
//
// The CSP forbids inline styles in markup, so the chart's positions are set
// through the CSSOM (element.style.left = ...), which the CSP allows.

import { fmtMs, h, plural } from "./dom.js";

const REASON_WORDS = {
  disconnect: "by the disconnect",
  shutdown: "by the server's shutdown",
  lost: "its host was lost",
};

/** "3 tokens · 1 request" for an ok block's foot ("" when there is nothing to say). */
export function usageWords(usage) {
  if (!usage) return "";
  const parts = [];
  if (usage.completion_tokens) parts.push(plural(usage.completion_tokens, "token", "tokens"));
  if (usage.requests) parts.push(plural(usage.requests, "request", "requests"));
  return parts.join(" · ");
}

/** An ok block whose cancel came too late: its effect stands, and the page says so. */
export function lateCancelLine(frame) {
  const who = { timeout: "its timeout", shutdown: "the server's shutdown" }[frame.late_cancel];
  const text = `done · ${who || "the cancel"} came too late: the command had already finished`;
  return h("div", "cmd-facts late-cancel", text);
}

/**
 * "cancelled · worker exited 41 ms after the cancel · 0 requests open · MCP tools/fetch stopped · 37 tokens".
 * The time is the server's: the unwind timeline's worker_exited step (the
 * terminal client says the same).
 */
export function factsLine(frame) {
  const lc = frame.lifecycle || {};
  const timeline = Array.isArray(lc.timeline) ? lc.timeline : [];
  const exited = timeline.find((step) => step.event === "worker_exited");
  const items = [];
  const reason = REASON_WORDS[frame.reason] || "";

  if (frame.status === "timeout") {
    // The block's header shows the whole time; the next item, how fast the unwind went.
    items.push({ text: "timed out", tone: "lead" });
  } else if (lc.started === false) {
    items.push({ text: `cancelled while queued${reason ? ` ${reason}` : ""}`, tone: "lead" });
  } else {
    items.push({ text: `cancelled${reason ? ` ${reason}` : ""}`, tone: "lead" });
  }

  if (lc.started === false) items.push({ text: "never started" });
  else if (lc.worker_exited === true && exited) {
    items.push({ text: `worker exited ${fmtMs(exited.ms)} after the cancel`, tone: "good" });
  } else if (lc.worker_exited === true) items.push({ text: "worker exited", tone: "good" });
  else if (lc.worker_exited === false) items.push({ text: "worker still running", tone: "warn" });
  else if (lc.worker_exited === null) items.push({ text: "worker exit unconfirmed", tone: "warn" });

  const openRequests = Number(lc.open_requests || 0);
  items.push({
    text: `${plural(openRequests, "request", "requests")} open`,
    tone: openRequests > 0 ? "warn" : null,
  });
  const openProcesses = Number(lc.open_processes || 0);
  if (openProcesses > 0) {
    items.push({ text: `${plural(openProcesses, "process", "processes")} open`, tone: "warn" });
  }
  const openThreads = Number(lc.open_threads || 0);
  if (openThreads > 0) {
    items.push({ text: `${plural(openThreads, "thread", "threads")} open`, tone: "warn" });
  }
  // Each MCP tool call the cancel reached, and whether its server stopped it.
  for (const call of Array.isArray(frame.mcp) ? frame.mcp : []) {
    const name = `MCP ${call.server}/${call.tool}`;
    if (call.stopped === true) items.push({ text: `${name} stopped`, tone: "good" });
    else if (call.stopped === false) items.push({ text: `${name} NOT stopped`, tone: "warn" });
    else items.push({ text: `${name}: stop unconfirmed`, tone: "warn" });
  }
  const tokens = Number((frame.usage && frame.usage.completion_tokens) || 0);
  items.push({ text: plural(tokens, "token", "tokens") });
  if (lc.node) items.push({ text: `on ${lc.node}` });
  return joinFacts(items);
}

/** The facts line of a command whose connection closed under it (no complete can come). */
export function disconnectedLine() {
  return joinFacts([
    { text: "cancelled by the disconnect", tone: "lead" },
    { text: "the server cancels every command of a closed connection; "
      + "its report had no connection left to arrive on" },
  ]);
}

function joinFacts(items) {
  const line = h("p", "facts");
  items.forEach((item, i) => {
    if (i > 0) line.append(h("span", "facts-sep", " · "));
    line.append(h("span", item.tone ? `fact fact-${item.tone}` : "fact", item.text));
  });
  return line;
}

/**
 * The unwind as a waterfall: one row per step, a bar from the step before to this
 * one, on a common scale of milliseconds after the cancel. `label(event)` gives a
 * step's words (the server's, from the catalog). Null when there is nothing to draw.
 */
export function unwindChart(lc, label) {
  const timeline = (Array.isArray(lc.timeline) ? lc.timeline : [])
    .filter((step) => step && typeof step.ms === "number")
    .slice()
    .sort((a, b) => a.ms - b.ms);
  const notExited = lc.started !== false && lc.worker_exited !== true;
  if (timeline.length < 2 && !notExited) return null;

  const last = timeline.length ? timeline[timeline.length - 1].ms : 0;
  const scale = last > 0 ? last : 1;

  const figure = h("figure", "unwind");
  if (notExited) figure.classList.add("unwind-leak");
  const caption = h("figcaption", "unwind-caption");
  caption.append(
    h("span", "unwind-title", "unwind"),
    h("span", "unwind-sub", notExited
      ? "ms after the cancel · the worker had not exited"
      : `ms after the cancel · done in ${fmtMs(last)}`),
  );
  figure.append(caption);

  const list = h("ol", "unwind-steps");
  let previous = 0;
  for (const step of timeline) {
    const row = h("li", "step");
    row.dataset.event = step.event;
    const name = h("span", "step-name", label(step.event));
    const [track, inner] = stepTrack();
    const bar = h("span", "step-bar");
    bar.style.left = `${(previous / scale) * 100}%`;
    bar.style.width = `${((step.ms - previous) / scale) * 100}%`;
    const dot = h("span", "step-dot");
    dot.style.left = `${(step.ms / scale) * 100}%`;
    inner.append(bar, dot);
    const ms = h("span", "step-ms", step.event === "cancel_requested" && step.ms === 0
      ? "0" : fmtMs(step.ms));
    row.append(name, track, ms);
    row.title = `${name.textContent}: ${step.ms} ms after the cancel`;
    list.append(row);
    previous = step.ms;
  }
  if (notExited) {
    const row = h("li", "step step-open");
    row.dataset.event = lc.worker_exited === null ? "worker_unconfirmed" : "worker_running";
    const name = h("span", "step-name", lc.worker_exited === null
      ? "worker exit unconfirmed" : "worker still running");
    const [track, inner] = stepTrack();
    const bar = h("span", "step-bar");
    bar.style.left = `${(previous / scale) * 100}%`;
    bar.style.right = "0";
    inner.append(bar);
    row.append(name, track, h("span", "step-ms", "…"));
    list.append(row);
  }
  figure.append(list);

  if (notExited) {
    const open = [];
    const requests = Number(lc.open_requests || 0);
    const processes = Number(lc.open_processes || 0);
    const threads = Number(lc.open_threads || 0);
    if (requests) open.push(plural(requests, "request", "requests"));
    if (processes) open.push(plural(processes, "process", "processes"));
    if (threads) open.push(plural(threads, "thread", "threads"));
    figure.append(h("p", "unwind-open", open.length
      ? `still open: ${open.join(", ")}`
      : lc.worker_exited === null
        ? "its host could not confirm whether the worker returned"
        : "the worker thread had not returned when the unwind bound passed"));
  }
  return figure;
}

// A row's track, and the scale inside it that percentages refer to: inset by a
// dot's radius, so a dot at 0 % or 100 % stays inside the track.
function stepTrack() {
  const track = h("span", "step-track");
  const inner = h("span", "step-scale");
  track.append(inner);
  return [track, inner];
}
