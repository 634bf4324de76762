// The wirecut console page: one WebSocket on /api/console, /api/health polled.
//
// Everything here goes through the public protocol (docs/protocol.md), so any
// other client could do the same. No framework and no build step: the server
// ships this file as it is. The page's behaviour is described in
// docs/web-console.md.
//
// The CSP forbids inline styles in markup, so positions in the unwind chart
// are set through the CSSOM (element.style.left = ...), which CSP allows.

"use strict";

(() => {
  // -- constants ----------------------------------------------------------------------

  const TOKEN_KEY = "wirecut.token"; // sessionStorage: the token, never in the address bar
  const HISTORY_KEY = "wirecut.history"; // localStorage: the prompt's history
  const HISTORY_MAX = 500;
  const HEALTH_EVERY_MS = 2000;
  const TICK_MS = 100;
  // Reconnect delays; the last one repeats. A little jitter keeps many tabs apart.
  const BACKOFF_MS = [500, 1000, 2000, 4000, 8000, 15000];
  // A block that streams for hours keeps only its last this-many characters.
  const OUTPUT_MAX_CHARS = 400000;
  // The protocol's close codes that a retry cannot fix.
  const CLOSE_UNAUTHORIZED = 4401;
  const CLOSE_FORBIDDEN_ORIGIN = 4403;

  // The commands of docs/protocol.md, for Tab until the server's `help` has answered.
  const BUILTIN_COMMANDS = {
    "help": { flags: [], alts: [] },
    "chat": { flags: ["--new"], alts: [] },
    "memory add": { flags: [], alts: [] },
    "memory list": { flags: [], alts: [] },
    "memory show": { flags: [], alts: [] },
    "curator status": { flags: [], alts: [] },
    "curator run": { flags: ["--consolidate", "--dry-run", "--yes"], alts: [] },
    "jobs": { flags: [], alts: [] },
    "sleep": { flags: [], alts: [] },
    "probe": {
      flags: [],
      alts: ["connect", "ttfb", "stream", "subprocess", "sleep", "python-loop",
        "nested-thread", "child-agent"],
    },
  };

  // The unwind steps a timeline can hold (wirecut.scope's TimelineEvent), in words.
  const EVENT_LABELS = {
    cancel_requested: "cancel requested",
    sockets_shut: "sockets shut",
    objects_interrupted: "objects interrupted",
    processes_signalled: "processes signalled",
    processes_killed: "processes killed",
    children_cancelled: "children cancelled",
    escalated: "escalated",
    worker_exited: "worker exited",
  };

  const REASON_WORDS = {
    disconnect: "by the disconnect",
    shutdown: "by the server's shutdown",
    lost: "its host was lost",
  };

  // WebSocket close codes a person may meet, in words (1006: no close frame at all).
  const CLOSE_WORDS = {
    1001: "the server went away",
    1011: "server error",
    1012: "the server is restarting",
  };

  const LIVE_STATES = new Set(["sending", "queued", "running", "confirm", "cancelling"]);

  // -- small helpers -----------------------------------------------------------------

  const $ = (id) => document.getElementById(id);

  function h(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function fmtMs(ms) {
    if (ms === null || ms === undefined || !isFinite(ms)) return "?";
    if (ms < 1) return `${ms.toFixed(2)} ms`;
    if (ms < 10) return `${ms.toFixed(1)} ms`;
    if (ms < 1000) return `${Math.round(ms)} ms`;
    if (ms < 60000) return `${(ms / 1000).toFixed(1)} s`;
    const minutes = Math.floor(ms / 60000);
    const seconds = Math.floor((ms % 60000) / 1000);
    return `${minutes}m ${String(seconds).padStart(2, "0")}s`;
  }

  function plural(n, one, many) {
    return `${n} ${n === 1 ? one : many}`;
  }

  function storageGet(storage, key) {
    try {
      return storage.getItem(key);
    } catch {
      return null; // Storage disabled (private modes, policies): the page still works.
    }
  }

  function storageSet(storage, key, value) {
    try {
      if (value === null) storage.removeItem(key);
      else storage.setItem(key, value);
    } catch {
      // Not kept across reloads then; nothing else depends on it.
    }
  }

  // -- the token: from ?token= once, then session storage ------------------------------

  function takeToken() {
    const url = new URL(location.href);
    const given = url.searchParams.get("token");
    if (given !== null) {
      storageSet(sessionStorage, TOKEN_KEY, given);
      url.searchParams.delete("token");
      // Out of the address bar (and so out of bookmarks, history and screen shares).
      history.replaceState(history.state, "", url.pathname + url.search + url.hash);
      return given;
    }
    return storageGet(sessionStorage, TOKEN_KEY);
  }

  const token = takeToken();
  const basePath = location.pathname.replace(/[^/]*$/, "");

  function consoleUrl() {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const query = token ? `?token=${encodeURIComponent(token)}` : "";
    return `${scheme}://${location.host}${basePath}api/console${query}`;
  }

  // -- page state --------------------------------------------------------------------

  const ui = {
    log: $("log"),
    prompt: $("prompt"),
    form: $("prompt-form"),
    ps: $("ps"),
    hint: $("hint-text"),
    conn: $("conn"),
    connText: $("conn-text"),
    connDetail: $("conn-detail"),
    reconnectNow: $("reconnect-now"),
    health: $("health"),
    healthItems: $("health-items"),
    jobs: $("jobs"),
    jobsEmpty: $("jobs-empty"),
    cancelAll: $("cancel-all"),
    dialog: $("confirm"),
    dialogLine: $("confirm-line"),
    dialogMessage: $("confirm-message"),
    dialogYes: $("confirm-yes"),
    dialogNo: $("confirm-no"),
    announce: $("announce"),
  };
  const defaultHint = ui.hint.innerHTML;

  const state = {
    ws: null,
    connected: false,
    everConnected: false,
    attempt: 0,
    retryTimer: null,
    countdown: null,
    retryAt: 0,
    lostAt: null,
    lostNotice: null,
    stopped: false, // a close code that a retry cannot fix
    seq: 0,
    hiddenSeq: 0,
    commands: new Map(), // id -> command (live or finished, while its block exists)
    confirmQueue: [], // ids waiting for the dialog
    confirming: null, // the id the dialog is asking about
    commandSpecs: new Map(Object.entries(BUILTIN_COMMANDS)),
    history: loadHistory(),
    historyPos: null,
    draft: "",
    tickTimer: null,
  };

  // -- the log -----------------------------------------------------------------------

  function nearBottom() {
    const log = ui.log;
    return log.scrollHeight - log.scrollTop - log.clientHeight < 48;
  }

  // Append (or grow) something in the log, following the end only if the reader was there.
  function withScroll(change) {
    const follow = nearBottom();
    change();
    if (follow) ui.log.scrollTop = ui.log.scrollHeight;
  }

  function notice(text, tone = "info") {
    const node = h("div", `notice notice-${tone}`);
    node.textContent = text;
    withScroll(() => ui.log.append(node));
    return node;
  }

  function announce(text) {
    ui.announce.textContent = text;
  }

  // -- commands ----------------------------------------------------------------------

  function newId() {
    state.seq += 1;
    return `c${state.seq}`;
  }

  function isLive(cmd) {
    return LIVE_STATES.has(cmd.state);
  }

  function liveCommands() {
    return [...state.commands.values()].filter((c) => isLive(c) && !c.hidden);
  }

  function buildBlock(cmd) {
    const root = h("article", "cmd");
    root.dataset.id = cmd.id;
    root.setAttribute("aria-label", `command ${cmd.id}: ${cmd.line}`);

    const head = h("header", "cmd-head");
    const line = h("div", "cmd-line");
    line.append(h("span", "cmd-ps", "›"), h("code", "cmd-text", cmd.line));
    const meta = h("div", "cmd-meta");
    const id = h("span", "cmd-id", cmd.id);
    id.title = "the command's id on this connection";
    const badge = h("span", "badge");
    const time = h("span", "cmd-time", "");
    const cancel = h("button", "btn btn-cancel btn-small cmd-cancel", "Cancel");
    cancel.type = "button";
    cancel.setAttribute("aria-label", `Cancel ${cmd.id}: ${cmd.line}`);
    cancel.addEventListener("click", () => {
      cancelCommand(cmd.id);
      ui.prompt.focus();
    });
    meta.append(id, badge, time, cancel);
    head.append(line, meta);

    const out = h("pre", "cmd-out");
    out.hidden = true;
    root.append(head, out);
    cmd.el = { root, badge, time, cancel, out };
    return root;
  }

  const BADGE_TEXT = {
    sending: "sending",
    queued: "queued",
    running: "running",
    confirm: "confirm?",
    cancelling: "cancelling…",
    ok: "ok",
    error: "error",
    cancelled: "cancelled",
    timeout: "timed out",
  };

  function setState(cmd, next) {
    cmd.state = next;
    if (!cmd.el) return;
    cmd.el.root.dataset.state = next;
    cmd.el.badge.textContent = BADGE_TEXT[next] || next;
    cmd.el.badge.dataset.state = next;
    cmd.el.cancel.hidden = !isLive(cmd) || next === "cancelling";
    renderJobs();
  }

  function runLine(line) {
    if (!state.connected) {
      hint("Not connected: the line is kept; press Enter again once the page has reconnected.",
        "warn");
      return false;
    }
    const cmd = {
      id: newId(),
      line,
      hidden: false,
      state: "sending",
      sentAt: performance.now(),
      elapsedMs: null,
      outChars: 0,
      lastStream: null,
      lastText: null,
    };
    state.commands.set(cmd.id, cmd);
    ui.log.append(buildBlock(cmd));
    ui.log.scrollTop = ui.log.scrollHeight; // a new command is always brought into view
    setState(cmd, "sending");
    send({ type: "run", id: cmd.id, line });
    ensureTicking();
    return true;
  }

  // A command the page runs for itself (the server's `help`, for Tab): no block.
  function runHidden(line, onDone) {
    const cmd = {
      id: `page-${(state.hiddenSeq += 1)}`,
      line,
      hidden: true,
      state: "sending",
      sentAt: performance.now(),
      text: "",
      onDone,
    };
    state.commands.set(cmd.id, cmd);
    send({ type: "run", id: cmd.id, line });
  }

  function cancelCommand(id) {
    const cmd = state.commands.get(id);
    if (!cmd || !isLive(cmd) || cmd.state === "cancelling") return;
    if (state.connected) send({ type: "cancel", id });
    setState(cmd, "cancelling");
    if (state.confirming === id) closeDialog();
    state.confirmQueue = state.confirmQueue.filter((x) => x !== id);
  }

  function cancelLatest() {
    const live = liveCommands().filter((c) => c.state !== "cancelling");
    if (live.length === 0) return false;
    cancelCommand(live[live.length - 1].id);
    return true;
  }

  function cancelAll() {
    const live = liveCommands();
    if (live.length === 0) return;
    // One frame without an id: the server cancels every command of this connection.
    if (state.connected) send({ type: "cancel" });
    for (const cmd of live) if (cmd.state !== "cancelling") setState(cmd, "cancelling");
    closeDialog();
    state.confirmQueue = [];
  }

  function appendOutput(cmd, stream, data) {
    if (cmd.hidden) {
      cmd.text += data;
      return;
    }
    const out = cmd.el.out;
    withScroll(() => {
      out.hidden = false;
      if (cmd.lastStream === stream && cmd.lastText) {
        cmd.lastText.appendData(data); // grows one text node: no re-layout of the whole block
      } else {
        const span = h("span", `out-${stream}`);
        cmd.lastText = document.createTextNode(data);
        span.append(cmd.lastText);
        out.append(span);
        cmd.lastStream = stream;
      }
      cmd.outChars += data.length;
      if (cmd.outChars > OUTPUT_MAX_CHARS) trimOutput(cmd);
    });
  }

  function trimOutput(cmd) {
    const out = cmd.el.out;
    let excess = cmd.outChars - OUTPUT_MAX_CHARS;
    for (const span of [...out.querySelectorAll("span[class^='out-']")]) {
      if (excess <= 0) break;
      const length = span.textContent.length;
      if (length <= excess && span.lastChild !== cmd.lastText) {
        span.remove();
        excess -= length;
        cmd.outChars -= length;
      } else {
        const text = span.firstChild;
        const cut = Math.min(excess, text.length);
        text.deleteData(0, cut);
        cmd.outChars -= cut;
        excess -= cut;
      }
    }
    if (!out.querySelector(".out-trimmed")) {
      out.prepend(h("span", "out-trimmed", "… earlier output trimmed\n"));
    }
  }

  // -- frames from the server ---------------------------------------------------------

  function onFrame(frame) {
    if (!frame || typeof frame !== "object") return;
    const cmd = frame.id !== undefined && frame.id !== null ? state.commands.get(frame.id) : null;
    switch (frame.type) {
      case "ready":
        onReady(frame);
        break;
      case "accepted":
        if (cmd && cmd.state === "sending") setState(cmd, frame.queued ? "queued" : "running");
        break;
      case "started":
        if (cmd && (cmd.state === "sending" || cmd.state === "queued")) setState(cmd, "running");
        break;
      case "output":
        if (cmd) appendOutput(cmd, frame.stream, String(frame.data));
        break;
      case "confirm_required":
        if (cmd) onConfirmRequired(cmd, String(frame.message || ""));
        break;
      case "complete":
        if (cmd) onComplete(cmd, frame);
        break;
      case "error":
        onErrorFrame(cmd, frame);
        break;
      default:
        break; // "pong", and frames a newer server may add
    }
  }

  function onReady(frame) {
    state.connected = true;
    state.attempt = 0;
    if (frame.prompt) ui.ps.textContent = String(frame.prompt).trim();
    setConn("connected", "connected", frame.version ? `wirecut ${frame.version}` : "");
    if (state.lostNotice) {
      const down = state.lostAt === null ? null : performance.now() - state.lostAt;
      state.lostNotice.append(
        h("span", "notice-ok", ` Reconnected${down === null ? "" : ` after ${fmtMs(down)}`}.`),
      );
      state.lostNotice = null;
      state.lostAt = null;
      announce("Reconnected.");
    } else if (!state.everConnected) {
      const hello = notice("", "hello");
      hello.append(
        h("strong", null, `wirecut ${frame.version || ""}`),
        document.createTextNode(" — type "),
        h("code", null, "help"),
        document.createTextNode(" for the commands. Each command runs in its own block; "
          + "Cancel stops it for real and shows how the unwind went."),
      );
    }
    state.everConnected = true;
    hint(null);
    runHidden("help", learnCommands);
    pollHealth();
  }

  function onErrorFrame(cmd, frame) {
    const message = String(frame.message || "error");
    if (cmd && !cmd.hidden) {
      if (cmd.state === "sending") {
        // The run itself was refused (e.g. a duplicate id): there will be no complete.
        finish(cmd, { status: "error", error: message });
        return;
      }
      if (!isLive(cmd)) return; // a cancel that crossed its command's complete: nothing to say
      addError(cmd, message);
      return;
    }
    if (cmd && cmd.hidden) return;
    notice(`server: ${message}`, "error");
  }

  function addError(cmd, message) {
    const box = h("div", "cmd-error");
    box.append(h("span", "cmd-error-label", "error"), document.createTextNode(message));
    withScroll(() => cmd.el.root.append(box));
  }

  function onComplete(cmd, frame) {
    if (cmd.hidden) {
      cmd.state = frame.status;
      state.commands.delete(cmd.id);
      if (cmd.onDone && frame.status === "ok") cmd.onDone(cmd.text);
      return;
    }
    finish(cmd, frame);
  }

  function finish(cmd, frame) {
    const status = frame.status || "error";
    cmd.elapsedMs = typeof frame.elapsed_ms === "number"
      ? frame.elapsed_ms : performance.now() - cmd.sentAt;
    setState(cmd, status);
    cmd.el.time.textContent = fmtMs(cmd.elapsedMs);
    if (state.confirming === cmd.id) closeDialog();
    state.confirmQueue = state.confirmQueue.filter((x) => x !== cmd.id);

    withScroll(() => {
      if (frame.error) addError(cmd, String(frame.error));
      if (status === "cancelled" || status === "timeout") {
        cmd.el.root.append(factsLine(frame));
        const chart = unwindChart(frame.lifecycle || {});
        if (chart) cmd.el.root.append(chart);
      } else if (status === "ok") {
        const extra = usageWords(frame.usage);
        if (extra) cmd.el.root.append(h("div", "cmd-foot", extra));
      }
    });
    announce(`${cmd.id} ${cmd.line}: ${BADGE_TEXT[status] || status}`);
    pollHealthSoon();
  }

  function usageWords(usage) {
    if (!usage) return "";
    const parts = [];
    if (usage.completion_tokens) parts.push(plural(usage.completion_tokens, "token", "tokens"));
    if (usage.requests) parts.push(plural(usage.requests, "request", "requests"));
    return parts.join(" · ");
  }

  // "cancelled in 41 ms · worker exited · 0 requests open · 37 tokens"
  function factsLine(frame) {
    const lc = frame.lifecycle || {};
    const timeline = Array.isArray(lc.timeline) ? lc.timeline : [];
    const exited = timeline.find((step) => step.event === "worker_exited");
    const elapsed = frame.elapsed_ms;
    const items = [];
    const reason = REASON_WORDS[frame.reason] || "";

    if (frame.status === "timeout") {
      // The block's header shows the whole time; here, how fast the unwind went.
      items.push({ text: "timed out", tone: "lead" });
      if (exited) items.push({ text: `unwound in ${fmtMs(exited.ms)}` });
    } else if (lc.started === false) {
      items.push({ text: `cancelled while queued${reason ? ` ${reason}` : ""}`, tone: "lead" });
    } else {
      const ms = exited ? exited.ms : elapsed;
      items.push({
        text: `cancelled${reason ? ` ${reason}` : ""} in ${fmtMs(ms)}`,
        tone: "lead",
      });
    }

    if (lc.started === false) items.push({ text: "never started" });
    else if (lc.worker_exited === true) items.push({ text: "worker exited", tone: "good" });
    else if (lc.worker_exited === false) items.push({ text: "worker still running", tone: "warn" });
    else if (lc.worker_exited === null) {
      items.push({ text: "worker exit unconfirmed", tone: "warn" });
    }

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
    const tokens = Number((frame.usage && frame.usage.completion_tokens) || 0);
    items.push({ text: plural(tokens, "token", "tokens") });
    if (lc.node) items.push({ text: `on ${lc.node}` });

    const line = h("p", "facts");
    items.forEach((item, i) => {
      if (i > 0) line.append(h("span", "facts-sep", " · "));
      line.append(h("span", item.tone ? `fact fact-${item.tone}` : "fact", item.text));
    });
    return line;
  }

  // The unwind as a waterfall: one row per step, a bar from the step before to this
  // one, on a common scale of milliseconds after the cancel.
  function unwindChart(lc) {
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
      const label = EVENT_LABELS[step.event] || String(step.event).replace(/_/g, " ");
      const name = h("span", "step-name", label);
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

  // -- the confirmation dialog -------------------------------------------------------

  function onConfirmRequired(cmd, message) {
    if (cmd.hidden) {
      send({ type: "cancel", id: cmd.id }); // never expected; never confirm on the user's behalf
      return;
    }
    setState(cmd, "confirm");
    cmd.confirmMessage = message;
    appendOutput(cmd, "confirm", `${message}\n`);
    state.confirmQueue.push(cmd.id);
    showNextConfirm();
  }

  function showNextConfirm() {
    if (state.confirming !== null) return;
    while (state.confirmQueue.length) {
      const id = state.confirmQueue.shift();
      const cmd = state.commands.get(id);
      if (!cmd || cmd.state !== "confirm") continue;
      state.confirming = id;
      ui.dialogLine.textContent = cmd.line;
      ui.dialogMessage.textContent = cmd.confirmMessage;
      ui.dialog.showModal();
      // The dialog itself takes focus, so Enter confirms only once the person is
      // looking at it (Enter typed at the prompt never reaches it).
      ui.dialog.focus();
      return;
    }
  }

  function closeDialog() {
    state.confirming = null;
    if (ui.dialog.open) {
      ui.dialog.close();
      ui.prompt.focus();
    }
    queueMicrotask(showNextConfirm);
  }

  function answerConfirm(yes) {
    const id = state.confirming;
    if (id === null) return;
    const cmd = state.commands.get(id);
    if (cmd && cmd.state === "confirm") {
      if (yes) {
        send({ type: "confirm", id });
        setState(cmd, "running");
        appendOutput(cmd, "note", "confirmed\n");
      } else {
        appendOutput(cmd, "note", "declined\n");
        cancelCommand(id); // declining is a cancel of that command
      }
    }
    closeDialog();
  }

  ui.dialogYes.addEventListener("click", () => answerConfirm(true));
  ui.dialogNo.addEventListener("click", () => answerConfirm(false));
  ui.dialog.addEventListener("cancel", (event) => {
    event.preventDefault(); // Esc: decline (and cancel), not just hide the question
    answerConfirm(false);
  });
  ui.dialog.addEventListener("keydown", (event) => {
    if (event.key !== "Enter" || event.repeat) return;
    // Enter on a focused button is that button's click; elsewhere in the dialog it confirms.
    if (event.target instanceof HTMLButtonElement) return;
    event.preventDefault();
    answerConfirm(true);
  });

  // -- the status strip --------------------------------------------------------------

  function renderJobs() {
    const live = liveCommands();
    const ids = live.map((c) => c.id).join(",");
    if (ui.jobs.dataset.ids !== ids) {
      ui.jobs.dataset.ids = ids;
      ui.jobs.replaceChildren(...live.map(jobChip));
    }
    for (const cmd of live) {
      const chip = ui.jobs.querySelector(`[data-id="${CSS.escape(cmd.id)}"]`);
      if (!chip) continue;
      chip.dataset.state = cmd.state;
      chip.querySelector(".job-state").textContent = BADGE_TEXT[cmd.state];
      chip.querySelector(".job-cancel").hidden = cmd.state === "cancelling";
    }
    ui.jobsEmpty.hidden = live.length > 0;
    document.title = live.length ? `(${live.length}) wirecut console` : "wirecut console";
    ui.cancelAll.hidden = live.filter((c) => c.state !== "cancelling").length === 0;
    updateTimes();
  }

  function jobChip(cmd) {
    const chip = h("li", "job");
    chip.dataset.id = cmd.id;
    const label = h("span", "job-label");
    label.append(
      h("span", "job-state"), h("code", "job-id", cmd.id), h("span", "job-line", cmd.line),
    );
    label.title = cmd.line;
    const time = h("span", "job-time");
    const cancel = h("button", "job-cancel", "×");
    cancel.type = "button";
    cancel.setAttribute("aria-label", `Cancel ${cmd.id}: ${cmd.line}`);
    cancel.title = "Cancel";
    cancel.addEventListener("click", () => {
      cancelCommand(cmd.id);
      ui.prompt.focus();
    });
    chip.append(label, time, cancel);
    return chip;
  }

  function updateTimes() {
    const now = performance.now();
    for (const cmd of state.commands.values()) {
      if (cmd.hidden || !isLive(cmd) || !cmd.el) continue;
      const text = fmtMs(now - cmd.sentAt);
      cmd.el.time.textContent = text;
      const chip = ui.jobs.querySelector(`[data-id="${CSS.escape(cmd.id)}"] .job-time`);
      if (chip) chip.textContent = text;
    }
  }

  function ensureTicking() {
    if (state.tickTimer !== null) return;
    state.tickTimer = setInterval(() => {
      updateTimes();
      if (liveCommands().length === 0) {
        clearInterval(state.tickTimer);
        state.tickTimer = null;
      }
    }, TICK_MS);
  }

  ui.cancelAll.addEventListener("click", () => {
    cancelAll();
    ui.prompt.focus();
  });

  // -- health ------------------------------------------------------------------------

  let healthTimer = null;
  let healthBusy = false;

  async function pollHealth() {
    if (healthBusy) return; // the answer on its way is fresh enough
    healthBusy = true;
    // A server that accepts and never answers must not stop the polling.
    const abort = new AbortController();
    const giveUp = setTimeout(() => abort.abort(), HEALTH_EVERY_MS * 2);
    try {
      const headers = token ? { Authorization: `Bearer ${token}` } : {};
      const response = await fetch(`${basePath}api/health`, {
        headers, cache: "no-store", signal: abort.signal,
      });
      if (response.status === 401) {
        renderHealth(null, "token refused");
      } else if (!response.ok) {
        renderHealth(null, `HTTP ${response.status}`);
      } else {
        renderHealth(await response.json(), null);
      }
    } catch {
      renderHealth(null, "unreachable");
    } finally {
      clearTimeout(giveUp);
      healthBusy = false;
    }
    // One chain of polls, however many times this was called.
    clearTimeout(healthTimer);
    healthTimer = setTimeout(pollHealth, HEALTH_EVERY_MS);
  }

  // After a command ends, show the server's counts now rather than up to 2 s later.
  let healthSoon = null;
  function pollHealthSoon() {
    if (healthSoon !== null) return;
    healthSoon = setTimeout(() => {
      healthSoon = null;
      pollHealth();
    }, 150);
  }

  function renderHealth(health, problem) {
    if (problem !== null) {
      ui.health.dataset.state = "down";
      ui.healthItems.replaceChildren(h("span", "hitem hitem-warn", problem));
      return;
    }
    const workers = health.workers || {};
    const openRequests = (health.requests || {}).open;
    const openProcesses = (health.processes || {}).open;
    const items = [
      ["busy", `${workers.busy ?? "?"}/${workers.max ?? "?"}`, "busy", "busy",
        workers.busy > 0 ? "active" : null],
      ["queued", workers.queued ?? "?", "queued", "queued", workers.queued > 0 ? "active" : null],
      ["leaked", workers.leaked ?? "?", "leaked", "leaked", workers.leaked > 0 ? "warn" : null],
      ["requests", openRequests ?? "?", openRequests === 1 ? "request open" : "requests open",
        "req", openRequests > 0 ? "active" : null],
      ["processes", openProcesses ?? "?", openProcesses === 1 ? "process" : "processes",
        "proc", openProcesses > 0 ? "active" : null],
    ];
    ui.health.dataset.state = workers.leaked > 0 ? "warn" : health.status === "ok" ? "ok" : "warn";
    ui.healthItems.replaceChildren(...items.map(([key, value, label, short, tone]) => {
      const item = h("span", tone ? `hitem hitem-${tone}` : "hitem");
      item.dataset.key = key;
      item.title = `${value} ${label}`;
      // The short label is for phone widths (the stylesheet picks one).
      item.append(h("b", null, value), h("span", "hl-long", ` ${label}`),
        h("span", "hl-short", ` ${short}`));
      return item;
    }));
  }

  // -- the connection ----------------------------------------------------------------

  function setConn(kind, text, detail = "") {
    ui.conn.dataset.state = kind;
    ui.connText.textContent = text;
    ui.connDetail.textContent = detail ? ` · ${detail}` : "";
    ui.reconnectNow.hidden = kind !== "waiting";
  }

  function send(frame) {
    if (state.ws && state.ws.readyState === WebSocket.OPEN) state.ws.send(JSON.stringify(frame));
  }

  function connect() {
    stopRetry();
    if (state.stopped) return;
    setConn("connecting", state.everConnected ? "reconnecting…" : "connecting…");
    let ws;
    try {
      ws = new WebSocket(consoleUrl());
    } catch (error) {
      onClosed(null, 1006, String(error));
      return;
    }
    state.ws = ws;
    ws.addEventListener("message", (event) => {
      let frame;
      try {
        frame = JSON.parse(event.data);
      } catch {
        return; // not the protocol; nothing sensible to show
      }
      onFrame(frame);
    });
    ws.addEventListener("close", (event) => onClosed(ws, event.code, event.reason));
  }

  function onClosed(ws, code, reason) {
    if (ws !== null && ws !== state.ws) return;
    const wasConnected = state.connected;
    state.ws = null;
    state.connected = false;

    // Closing a connection cancels every command of it on the server (docs/protocol.md);
    // their complete frames had nowhere to go, so the page says it itself.
    const orphans = [...state.commands.values()].filter(isLive);
    const shown = orphans.filter((c) => !c.hidden);
    for (const cmd of orphans) {
      if (cmd.hidden) {
        state.commands.delete(cmd.id);
        continue;
      }
      setState(cmd, "cancelled");
      cmd.el.time.textContent = fmtMs(performance.now() - cmd.sentAt);
      const line = h("p", "facts");
      line.append(
        h("span", "fact fact-lead", "cancelled by the disconnect"),
        h("span", "facts-sep", " · "),
        h("span", "fact", "the server cancels every command of a closed connection; "
          + "its report had no connection left to arrive on"),
      );
      withScroll(() => cmd.el.root.append(line));
    }
    closeDialog();
    state.confirmQueue = [];

    if (code === CLOSE_UNAUTHORIZED || code === CLOSE_FORBIDDEN_ORIGIN) {
      state.stopped = true;
      if (code === CLOSE_UNAUTHORIZED) storageSet(sessionStorage, TOKEN_KEY, null);
      const why = code === CLOSE_UNAUTHORIZED
        ? "The server refused the token. Open the address that `wirecut serve` printed "
          + "(it ends in ?token=…)."
        : "The server refused this page's origin.";
      setConn("stopped", code === CLOSE_UNAUTHORIZED ? "token refused" : "origin refused");
      notice(why, "error");
      return;
    }

    if (wasConnected || !state.lostNotice) {
      state.lostAt = wasConnected ? performance.now() : state.lostAt ?? performance.now();
      let text = wasConnected
        ? `Connection lost${closeWords(code, reason)}.`
        : "Cannot reach the server.";
      if (shown.length) {
        text += ` ${plural(shown.length, "command", "commands")} of that connection `
          + `${shown.length === 1 ? "was" : "were"} cancelled by the disconnect `
          + `(${shown.map((c) => c.id).join(", ")}).`;
      }
      text += " Reconnecting…";
      state.lostNotice = notice(text, "warn");
      announce(text);
    }
    scheduleReconnect();
  }

  function closeWords(code, reason) {
    const known = CLOSE_WORDS[code];
    if (reason) return ` (${known ? `${known}: ` : `code ${code}: `}${reason})`;
    if (known) return ` (${known})`;
    return code && code !== 1006 ? ` (code ${code})` : "";
  }

  function scheduleReconnect() {
    const base = BACKOFF_MS[Math.min(state.attempt, BACKOFF_MS.length - 1)];
    const delay = Math.round(base * (0.8 + Math.random() * 0.4));
    state.attempt += 1;
    state.retryAt = performance.now() + delay;
    const show = () => {
      const left = Math.max(0, state.retryAt - performance.now());
      setConn("waiting", `disconnected · retrying in ${Math.ceil(left / 1000)} s`);
    };
    show();
    stopRetry();
    state.countdown = setInterval(show, 250);
    state.retryTimer = setTimeout(connect, delay);
  }

  function stopRetry() {
    clearTimeout(state.retryTimer);
    clearInterval(state.countdown);
    state.retryTimer = null;
    state.countdown = null;
  }

  ui.reconnectNow.addEventListener("click", () => {
    state.attempt = 0;
    connect();
    ui.prompt.focus();
  });
  // Back online, or back to this tab: no reason to sit out the rest of a long backoff.
  window.addEventListener("online", () => {
    if (state.retryTimer !== null) connect();
  });
  document.addEventListener("visibilitychange", () => {
    if (document.visibilityState === "visible" && state.retryTimer !== null) connect();
  });

  // -- Tab completion ----------------------------------------------------------------

  // Learn the command names (and their flags and alternatives) from `help`'s usage column.
  function learnCommands(text) {
    for (const raw of text.split("\n")) {
      const usage = raw.split(/\s{2,}/)[0].trim();
      if (!usage || usage.endsWith(":") || /^provider:/.test(usage)) continue;
      const words = usage.split(/\s+/);
      const name = [];
      const spec = { flags: [], alts: [] };
      let i = 0;
      for (; i < words.length && /^[a-z][a-z0-9-]*$/.test(words[i]); i++) name.push(words[i]);
      if (!name.length) continue;
      for (; i < words.length; i++) {
        const word = words[i];
        const flag = /^\[(--[a-z][a-z0-9-]*)\]$/.exec(word);
        if (flag) spec.flags.push(flag[1]);
        else if (/^[a-z][a-z0-9-]*(\|[a-z][a-z0-9-]*)+$/.test(word)) {
          spec.alts.push(...word.split("|"));
        }
      }
      state.commandSpecs.set(name.join(" "), spec);
    }
  }

  function commonPrefix(words) {
    if (!words.length) return "";
    let prefix = words[0];
    for (const word of words) {
      while (!word.startsWith(prefix)) prefix = prefix.slice(0, -1);
    }
    return prefix;
  }

  // What Tab would do with `text`: {completed, choices} or null when it has nothing to offer.
  function complete(text) {
    if (/^\s/.test(text)) return null;
    const names = [...state.commandSpecs.keys()].sort();
    // The command name is still being typed.
    const typedName = names.filter((n) => n.startsWith(text));
    const known = names.filter((n) => text.startsWith(`${n} `))
      .sort((a, b) => b.length - a.length)[0];
    if (!known) {
      if (!typedName.length) return null;
      if (typedName.length === 1) return { completed: `${typedName[0]} `, choices: [] };
      const prefix = commonPrefix(typedName);
      return { completed: prefix, choices: typedName };
    }
    // After the name: a flag, or one of the alternatives as the first argument.
    const spec = state.commandSpecs.get(known);
    const rest = text.slice(known.length + 1);
    const parts = rest.split(" ");
    const partial = parts[parts.length - 1];
    const before = parts.slice(0, -1);
    let pool = [];
    if (partial.startsWith("-")) pool = spec.flags.filter((f) => !before.includes(f));
    else if (before.length === 0) pool = spec.alts;
    const matches = pool.filter((w) => w.startsWith(partial));
    if (!matches.length) return null;
    const head = text.slice(0, text.length - partial.length);
    if (matches.length === 1) return { completed: `${head}${matches[0]} `, choices: [] };
    return { completed: head + commonPrefix(matches), choices: matches.map((m) => m) };
  }

  function hint(text, tone) {
    if (text === null) {
      ui.hint.innerHTML = defaultHint; // our own static markup, read at load
      ui.hint.dataset.tone = "";
      return;
    }
    ui.hint.textContent = text;
    ui.hint.dataset.tone = tone || "";
  }

  // -- history -----------------------------------------------------------------------

  function loadHistory() {
    try {
      const stored = JSON.parse(storageGet(localStorage, HISTORY_KEY) || "[]");
      return Array.isArray(stored) ? stored.filter((x) => typeof x === "string") : [];
    } catch {
      return [];
    }
  }

  function remember(line) {
    // Another tab may have added lines since this one loaded: merge, newest last.
    const history = loadHistory();
    if (history[history.length - 1] !== line) history.push(line);
    state.history = history.slice(-HISTORY_MAX);
    storageSet(localStorage, HISTORY_KEY, JSON.stringify(state.history));
  }

  function historyStep(delta) {
    const list = state.history;
    if (!list.length) return;
    if (state.historyPos === null) {
      if (delta > 0) return;
      state.draft = ui.prompt.value;
      state.historyPos = list.length;
    }
    const next = state.historyPos + delta;
    if (next < 0) return;
    if (next >= list.length) {
      state.historyPos = null;
      setPrompt(state.draft);
      return;
    }
    state.historyPos = next;
    setPrompt(list[next]);
  }

  function setPrompt(value) {
    ui.prompt.value = value;
    const end = value.length;
    ui.prompt.setSelectionRange(end, end);
  }

  // -- keys and the prompt -----------------------------------------------------------

  ui.form.addEventListener("submit", (event) => {
    event.preventDefault();
    const line = ui.prompt.value.trim();
    if (!line) return;
    if (runLine(line)) {
      remember(line);
      state.historyPos = null;
      state.draft = "";
      ui.prompt.value = "";
      hint(null);
    }
  });

  ui.prompt.addEventListener("keydown", (event) => {
    if (event.key === "ArrowUp" && !event.altKey && !event.shiftKey) {
      event.preventDefault();
      historyStep(-1);
    } else if (event.key === "ArrowDown" && !event.altKey && !event.shiftKey) {
      event.preventDefault();
      historyStep(1);
    } else if (event.key === "Tab" && !event.shiftKey && !event.ctrlKey && !event.altKey) {
      const atEnd = ui.prompt.selectionStart === ui.prompt.value.length;
      const result = ui.prompt.value && atEnd ? complete(ui.prompt.value) : null;
      // Nothing to complete: Tab moves the focus on, as everywhere else on the page.
      if (!result) return;
      event.preventDefault();
      setPrompt(result.completed);
      if (result.choices.length > 1) hint(result.choices.join("   "), "choices");
      else hint(null);
    } else if (event.key === "l" && event.ctrlKey && !event.altKey && !event.metaKey) {
      event.preventDefault();
      clearFinished();
    }
  });

  ui.prompt.addEventListener("input", () => {
    state.historyPos = null;
    if (ui.hint.dataset.tone) hint(null);
  });

  document.addEventListener("keydown", (event) => {
    if (event.key !== "Escape" || ui.dialog.open) return;
    if (event.shiftKey) {
      event.preventDefault();
      cancelAll();
      return;
    }
    if (cancelLatest()) {
      event.preventDefault();
    } else if (document.activeElement === ui.prompt && ui.prompt.value) {
      event.preventDefault();
      setPrompt("");
      state.historyPos = null;
    }
  });

  // Ctrl+L: clear finished blocks, keep the live ones.
  function clearFinished() {
    for (const node of [...ui.log.children]) {
      const cmd = node.dataset.id ? state.commands.get(node.dataset.id) : null;
      if (cmd && isLive(cmd)) continue;
      if (cmd) state.commands.delete(cmd.id);
      node.remove();
    }
  }

  // Typing anywhere (outside a button or the dialog) goes to the prompt.
  document.addEventListener("keydown", (event) => {
    if (ui.dialog.open || event.ctrlKey || event.metaKey || event.altKey) return;
    if (event.key.length !== 1 || document.activeElement === ui.prompt) return;
    if (document.activeElement instanceof HTMLButtonElement && event.key === " ") return;
    ui.prompt.focus();
  });

  // -- start -------------------------------------------------------------------------

  renderJobs();
  connect();
  pollHealth();
  ui.prompt.focus();
})();
