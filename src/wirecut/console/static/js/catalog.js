// What the server says it can do: its commands (for Tab), its MCP servers' tools
// and the words for the steps of an unwind timeline, from GET /api/commands
// (docs/protocol.md).
//
// The page copies neither list: a server with a new command or a new timeline
// event is completed and labelled without a new page. Until the catalog has
// arrived (or if it cannot), Tab completes nothing and a step is labelled by
// its event name with the underscores as spaces.

const FLAG = /^\[(--[a-z][a-z0-9-]*)(?: [A-Z]+)?\]$/;
const CHOICES = /^[a-z][a-z0-9-]*(\|[a-z][a-z0-9-]*)+$/;

export class Catalog {
  constructor() {
    /** "curator run" -> {flags: ["--consolidate", …], alts: […], usage, summary} */
    this.commands = new Map();
    /** "sockets_shut" -> "sockets shut" */
    this.labels = new Map();
    /** [{server, status, error, tools: [{name, tool, description}]}] */
    this.mcp = [];
  }

  /** Fetch the catalog once; true when it came. Never throws: the page works without it. */
  async load(url, headers) {
    try {
      const response = await fetch(url, { headers, cache: "no-store" });
      if (!response.ok) return false;
      this.take(await response.json());
      return true;
    } catch {
      return false;
    }
  }

  /** Read a catalog object ({commands: [{name, usage, summary}], timeline: {event: label}}). */
  take(catalog) {
    const commands = new Map();
    for (const entry of Array.isArray(catalog?.commands) ? catalog.commands : []) {
      if (!entry || typeof entry.name !== "string" || typeof entry.usage !== "string") continue;
      commands.set(entry.name, { ...specOf(entry.name, entry.usage), summary: entry.summary });
    }
    this.commands = commands;
    const labels = new Map();
    for (const [event, label] of Object.entries(catalog?.timeline || {})) {
      if (typeof label === "string") labels.set(event, label);
    }
    this.labels = labels;
    this.mcp = (Array.isArray(catalog?.mcp) ? catalog.mcp : [])
      .filter((entry) => entry && typeof entry.server === "string");
  }

  /** "MCP tools for chat — tools: fetch, run · web: not used (why)"; "" without servers. */
  mcpWords() {
    if (!this.mcp.length) return "";
    const parts = this.mcp.map((entry) => {
      const tools = (Array.isArray(entry.tools) ? entry.tools : []).map((t) => String(t.tool));
      if (entry.status === "ready") return `${entry.server}: ${tools.join(", ") || "no tools"}`;
      return `${entry.server}: not used${entry.error ? ` (${entry.error})` : ""}`;
    });
    return `MCP tools for chat — ${parts.join(" · ")}`;
  }

  /** The words for one step of an unwind timeline. */
  label(event) {
    return this.labels.get(event) || String(event).replace(/_/g, " ");
  }

  /** What Tab does with `text`: {completed, choices}, or null when it has nothing to offer. */
  complete(text) {
    if (/^\s/.test(text)) return null;
    const names = [...this.commands.keys()].sort();
    const known = names.filter((n) => text.startsWith(`${n} `))
      .sort((a, b) => b.length - a.length)[0];
    if (!known) {
      // The command name is still being typed.
      const typed = names.filter((n) => n.startsWith(text));
      if (!typed.length) return null;
      if (typed.length === 1) return { completed: `${typed[0]} `, choices: [] };
      return { completed: commonPrefix(typed), choices: typed };
    }
    // After the name: a flag, or one of the alternatives as the first argument.
    const spec = this.commands.get(known);
    const parts = text.slice(known.length + 1).split(" ");
    const partial = parts[parts.length - 1];
    const before = parts.slice(0, -1);
    let pool = [];
    if (partial.startsWith("-")) pool = spec.flags.filter((f) => !before.includes(f));
    else if (before.length === 0) pool = spec.alts;
    const matches = pool.filter((w) => w.startsWith(partial));
    if (!matches.length) return null;
    const head = text.slice(0, text.length - partial.length);
    if (matches.length === 1) return { completed: `${head}${matches[0]} `, choices: [] };
    return { completed: head + commonPrefix(matches), choices: matches };
  }
}

// A usage line's flags ("[--dry-run]", "[--stale-days DAYS]") and choices ("a|b|c").
function specOf(name, usage) {
  const spec = { usage, flags: [], alts: [] };
  const words = usage.match(/\[[^\]]*\]|\S+/g) || [];
  const skip = name.split(" ").length;
  for (const word of words.slice(skip)) {
    const flag = FLAG.exec(word);
    if (flag) spec.flags.push(flag[1]);
    else if (CHOICES.test(word)) spec.alts.push(...word.split("|"));
  }
  return spec;
}

function commonPrefix(words) {
  if (!words.length) return "";
  let prefix = words[0];
  for (const word of words) {
    while (!word.startsWith(prefix)) prefix = prefix.slice(0, -1);
  }
  return prefix;
}
