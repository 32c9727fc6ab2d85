// The words the user reads: step lines from the host's per-knowledge-base
// statuses, the save report, citations in an answer, and the score bars of
// "Test this search". Pure: strings and plain objects in, strings and plain
// objects out; the pages turn them into DOM nodes.

/**
 * @typedef {object} KbStatus
 * @property {string} [kb]
 * @property {string} [kb_name]
 * @property {"passages"|"weaker"|"nothing"|"empty"|"skipped"|"unavailable"} status
 * @property {number} [count] relevant passages
 * @property {number} [weaker] matches below the cut-off
 * @property {number | null} [best]
 * @property {number | null} [cutoff]
 * @property {string} [message]
 * @property {boolean} [degraded] keyword search only (the embedder is unavailable)
 * @property {string} [line] the host's own wording of this line (search.status_line)
 */

import { renderedLine } from "./fragments.js";

/**
 * @typedef {object} SaveReport
 * @property {string} [title]
 * @property {"added"|"updated"|"unchanged"} [status]
 * @property {number} [added]
 * @property {number} [updated]
 * @property {number} [unchanged]
 * @property {number} [removed]
 * @property {number} [failed]
 * @property {number} [total]
 * @property {{chunk_index: number, reason: string}[]} [failures]
 * @property {string} [summary]
 */

/**
 * @typedef {object} Citation
 * @property {number} n
 * @property {string} [kb]
 * @property {string} [kb_name]
 * @property {string} [title]
 * @property {string} [url]
 * @property {number} [chunk_index]
 * @property {number | null} [page]
 * @property {number} [chunk_count] passages in its source
 * @property {number} [score] fused rank score, 0..1
 * @property {number | null} [cosine] similarity to the question, what the cut-off applies to
 * @property {string} [text]
 */

const SEP = " · ";

/**
 * A score as the step lines print it: two decimals.
 * @param {number | null | undefined} x
 * @returns {string}
 */
export function formatScore(x) {
  return typeof x === "number" && Number.isFinite(x) ? x.toFixed(2) : "–";
}

/**
 * `n word` or `n words`.
 * @param {number} n
 * @param {string} one
 * @param {string} many
 */
function plural(n, one, many) {
  return `${n} ${n === 1 ? one : many}`;
}

/**
 * The host may send a ready-made explanation in `message`; a message that
 * already is the whole line (starts with the name) is not repeated after it.
 * @param {string} name
 * @param {string | undefined} message
 * @param {string} fallback
 */
function reason(name, message, fallback) {
  const text = (message ?? "").trim();
  if (!text) return fallback;
  const prefix = `${name}${SEP}`;
  if (text.startsWith(prefix)) return null;
  return text;
}

/**
 * One step line for one knowledge base, worded exactly as the product shows it:
 * "Docs · 3 passages", "Docs · 2 weaker matches",
 * "Docs · nothing relevant (best 0.28, cut-off 0.35)", "Docs · empty",
 * "Docs · skipped · device only, <model> is a cloud model",
 * "Docs · unavailable · the search could not run".
 * @param {KbStatus} status
 * @param {{model?: string | null}} [context] the model name, for a skip the host did not explain
 * @returns {string}
 */
export function stepLine(status, context = {}) {
  // The host words every line itself (the CLI prints the same words); the fallback below
  // is for a host that sends none.
  if (typeof status.line === "string" && status.line.trim()) return status.line.trim();
  const name = status.kb_name || status.kb || "Knowledge base";
  const count = Number.isInteger(status.count) ? /** @type {number} */ (status.count) : 0;
  switch (status.status) {
    case "passages": {
      const degraded = status.degraded ? `${SEP}keyword only, the embedder is unavailable` : "";
      return `${name}${SEP}${plural(count, "passage", "passages")}${degraded}`;
    }
    case "weaker": {
      // `count` is the relevant passages (none, for this status); `weaker` is what was found.
      const weaker = Number.isInteger(status.weaker) ? /** @type {number} */ (status.weaker) : count;
      return `${name}${SEP}${plural(weaker, "weaker match", "weaker matches")}`;
    }
    case "nothing": {
      const best = typeof status.best === "number" ? `best ${formatScore(status.best)}, ` : "";
      const detail = typeof status.cutoff === "number" ? ` (${best}cut-off ${formatScore(status.cutoff)})` : "";
      return `${name}${SEP}nothing relevant${detail}`;
    }
    case "empty":
      return `${name}${SEP}empty`;
    case "skipped": {
      const model = context.model || "the model";
      const why = reason(name, status.message, `device only, ${model} is a cloud model`);
      return why === null ? /** @type {string} */ (status.message).trim() : `${name}${SEP}skipped${SEP}${why}`;
    }
    case "unavailable": {
      const why = reason(name, status.message, "the search could not run");
      return why === null
        ? /** @type {string} */ (status.message).trim()
        : `${name}${SEP}unavailable${SEP}${why}`;
    }
    default:
      return `${name}${SEP}${String(status.status ?? "unknown")}`;
  }
}

/**
 * Whether "Use weaker matches for this reply" can change anything for this status.
 * @param {KbStatus} status
 */
export function canUseWeaker(status) {
  // A "nothing" status has hits, but below the band worth offering (the host's own count
  // of weaker matches is only on "weaker" lines).
  return status.status === "weaker";
}

/**
 * Whether "Test this search" has a search to show for this status.
 * @param {KbStatus} status
 */
export function canTestSearch(status) {
  return status.status !== "skipped" && status.status !== "empty" && status.status !== "unavailable";
}

/**
 * The honest one-line report of a save: what was counted, never "Success".
 * "24 passages added · 3 updated", "unchanged", "3 of 27 passages could not be saved".
 * @param {SaveReport} report
 * @returns {string}
 */
export function reportText(report) {
  const n = (/** @type {keyof SaveReport} */ key) => {
    const v = report?.[key];
    return typeof v === "number" && Number.isFinite(v) ? v : 0;
  };
  const failed = n("failed");
  const counts = [];
  // "17 added" left the reader asking "of what?": the first count names its unit.
  if (n("added")) counts.push(`${plural(n("added"), "passage", "passages")} added`);
  if (n("updated")) counts.push(counts.length ? `${n("updated")} updated` : `${plural(n("updated"), "passage", "passages")} updated`);
  if (n("removed")) counts.push(`${n("removed")} removed`);
  if (failed > 0) {
    const total = Math.max(n("total"), failed);
    const head = `${failed} of ${total} ${total === 1 ? "passage" : "passages"} could not be saved`;
    return counts.length ? `${head}${SEP}${counts.join(SEP)}` : head;
  }
  if (counts.length) return counts.join(SEP);
  if (report?.status === "unchanged" || n("unchanged") > 0) return "unchanged";
  return report?.summary || "nothing saved";
}

/**
 * Badge text and colour for a finished save: four characters at most, which
 * is what the toolbar shows; the notification carries the exact counts.
 * @param {SaveReport} report
 * @returns {{text: string, color: string}}
 */
export function reportBadge(report) {
  const failed = report?.failed ?? 0;
  if (failed > 0) return { text: signed("!", failed), color: "#b3261e" };
  const changed = (report?.added ?? 0) + (report?.updated ?? 0) + (report?.removed ?? 0);
  if (changed > 0) return { text: signed("+", changed), color: "#1e6b3a" };
  return { text: "=", color: "#5f6368" };
}

/**
 * A count with a leading sign in four characters: "+27", "+12k", "≥99k".
 * @param {string} sign
 * @param {number} n
 */
function signed(sign, n) {
  return n >= 100_000 ? "≥99k" : `${sign}${compact(n)}`;
}

/**
 * Numbers in three characters: 999, 12k (rounded down, so never overstated).
 * @param {number} n
 */
export function compact(n) {
  if (n < 1000) return String(n);
  return `${Math.min(99, Math.floor(n / 1000))}k`;
}

/**
 * @typedef {{type: "text", text: string} | {type: "cite", n: number, citation: Citation, label: string}} AnswerPiece
 */

/**
 * Split an answer into text and citation pieces. `[1]`, `[1, 3]` and `[2][3]`
 * become links; a number with no matching citation stays plain text, because
 * the host only vouches for the citations it returned.
 * @param {string} answer
 * @param {Citation[]} citations
 * @returns {AnswerPiece[]}
 */
export function splitCitations(answer, citations) {
  const byN = new Map((citations ?? []).map((c) => [c.n, c]));
  /** @type {AnswerPiece[]} */
  const pieces = [];
  const pushText = (/** @type {string} */ text) => {
    if (!text) return;
    const last = pieces[pieces.length - 1];
    if (last && last.type === "text") last.text += text;
    else pieces.push({ type: "text", text });
  };
  const pattern = /\[(\d+(?:\s*,\s*\d+)*)\]/g;
  let at = 0;
  for (const match of String(answer ?? "").matchAll(pattern)) {
    const numbers = match[1].split(",").map((s) => Number.parseInt(s.trim(), 10));
    if (!numbers.every((k) => byN.has(k))) continue;
    pushText(answer.slice(at, match.index));
    for (const k of numbers) {
      pieces.push({ type: "cite", n: k, citation: /** @type {Citation} */ (byN.get(k)), label: `[${k}]` });
    }
    at = /** @type {number} */ (match.index) + match[0].length;
  }
  pushText(String(answer ?? "").slice(at));
  return pieces;
}

/**
 * The facts a passage card lists, in reading order.
 * @param {Citation} c
 * @returns {{label: string, value: string}[]}
 */
export function passageFacts(c) {
  const facts = [{ label: "Knowledge base", value: c.kb_name || c.kb || "–" }];
  facts.push({ label: "Source", value: c.title || c.url || "untitled" });
  if (Number.isInteger(c.chunk_index)) {
    const of = Number.isInteger(c.chunk_count) ? ` of ${c.chunk_count}` : "";
    facts.push({ label: "Passage", value: `#${/** @type {number} */ (c.chunk_index) + 1}${of}` });
  }
  if (Number.isInteger(c.page)) facts.push({ label: "Page", value: String(c.page) });
  // The cosine is the number the cut-off and "Test this search" speak of; the fused score is
  // only a rank (the best passage of every search has 1.00), so it is shown only without one.
  if (typeof c.cosine === "number") facts.push({ label: "Similarity", value: formatScore(c.cosine) });
  else if (typeof c.score === "number") facts.push({ label: "Score", value: formatScore(c.score) });
  return facts;
}

/**
 * @typedef {object} ScoreRow
 * @property {string} label
 * @property {number | null} value the score the cut-off applies to (cosine)
 * @property {number} pct bar length, 0..100, on the shared scale
 * @property {boolean} above whether the score clears the cut-off
 * @property {any} hit
 */

/**
 * Layout of the "Test this search" chart: one bar per hit on a shared scale
 * and where the cut-off line crosses them. The scale starts at 0 unless a
 * score is negative (cosine can be), and always includes the cut-off.
 * @param {{cosine?: number | null, score?: number, title?: string, chunk_index?: number}[]} hits
 * @param {number | null | undefined} cutoff
 * @returns {{rows: ScoreRow[], cutoffPct: number | null, min: number, max: number}}
 */
export function scoreBars(hits, cutoff) {
  const values = (hits ?? []).map((h) => (typeof h.cosine === "number" ? h.cosine : null));
  const known = /** @type {number[]} */ (values.filter((v) => v !== null));
  const hasCut = typeof cutoff === "number" && Number.isFinite(cutoff);
  const min = Math.min(0, ...known, hasCut ? /** @type {number} */ (cutoff) : 0);
  // Cosine tops out at 1, so the scale does too: bar lengths then read as
  // absolute similarity, comparable from one search to the next.
  const top = Math.max(1, ...known, hasCut ? /** @type {number} */ (cutoff) : 0);
  const span = top - min;
  const pct = (/** @type {number} */ v) => Math.round(((v - min) / span) * 1000) / 10;
  const rows = (hits ?? []).map((hit, i) => {
    const v = values[i];
    const where = Number.isInteger(hit.chunk_index) ? ` · #${/** @type {number} */ (hit.chunk_index) + 1}` : "";
    return {
      label: `${hit.title || "untitled"}${where}`,
      value: v,
      pct: v === null ? 0 : pct(v),
      above: v !== null && hasCut ? v >= /** @type {number} */ (cutoff) : v !== null,
      rank: i + 1,
      hit,
    };
  });
  // The search's order is fused (vector and keyword), so its cosines are not monotone: the
  // chart reads top-down by the similarity it draws, each row keeping its rank in the search.
  rows.sort((a, b) => (b.value ?? -Infinity) - (a.value ?? -Infinity) || a.rank - b.rank);
  return { rows, cutoffPct: hasCut ? pct(/** @type {number} */ (cutoff)) : null, min, max: top };
}

/**
 * The first words of a passage as the page reads: without the title line the host puts in
 * front of every passage (the row already shows the title), headings set off by " · ", and
 * no Markdown marks (code ticks, emphasis, link addresses, table pipes).
 * @param {string | undefined} text
 * @param {string | undefined} title
 * @param {number} [max] characters
 */
export function passageSnippet(text, title, max = 160) {
  let lines = String(text ?? "").split("\n").map((l) => l.trim()).filter(Boolean);
  if (lines.length > 1 && title && (lines[0] === title.trim() || (lines[0].endsWith("…") && title.startsWith(lines[0].slice(0, -1))))) lines = lines.slice(1);
  // A heading that repeats the title (a page's own <h1>) says nothing the row does not.
  lines = lines.filter((l, i) => !(i === 0 && /^#+\s/.test(l) && l.replace(/^#+\s*/, "") === String(title ?? "").trim()));
  const flat = lines
    .map((l) => (/^#+\s/.test(l) ? `${renderedLine(l.replace(/^#+\s*/, ""))} ·` : renderedLine(l)))
    .join(" ")
    .replace(/\s+/g, " ")
    .trim();
  return flat.length > max ? `${flat.slice(0, max).replace(/\s+\S*$/, "")}…` : flat;
}

/**
 * The privacy label shown on a knowledge base.
 * @param {"device"|"cloud"|string} privacy
 */
export function privacyLabel(privacy) {
  return privacy === "cloud" ? "cloud OK" : "device only";
}

/**
 * One line about the model that will answer: name and where it runs.
 * @param {{name?: string, location?: "device"|"cloud"|null} | null | undefined} endpoint
 */
export function modelLine(endpoint) {
  if (!endpoint || !endpoint.name) return "No language model: answers quote your passages";
  return `${endpoint.name} · ${locationWords(endpoint.location).text}`;
}

/**
 * Whether the host error means the host is not installed (or not allowed),
 * so the page should show the install command instead of an error.
 * @param {{code?: string} | null | undefined} error
 */
export function isHostMissing(error) {
  return error?.code === "host_missing" || error?.code === "host_forbidden";
}

/**
 * The words for where the host says a model runs. The host is the only judge
 * (`location` in config.get and chat results); null means it could not decide,
 * and the host then treats the endpoint as cloud.
 * @param {"device" | "cloud" | null | undefined} location
 * @returns {{text: string, kind: "device" | "cloud" | "unknown"}}
 */
export function locationWords(location) {
  if (location === "device") return { text: "on device", kind: "device" };
  if (location === "cloud") return { text: "cloud", kind: "cloud" };
  return { text: "unknown (treated as cloud)", kind: "unknown" };
}

/** Human words for the host's save stages. */
export const STAGE_LABELS = Object.freeze({
  model: "Preparing the embedding model",
  extract: "Reading",
  chunk: "Splitting into passages",
  embed: "Embedding",
  write: "Writing",
});

/**
 * "about 40 s left", "about 3 min left".
 * @param {number} seconds
 */
function eta(seconds) {
  if (seconds < 90) return `about ${Math.max(1, Math.round(seconds))} s left`;
  return `about ${Math.round(seconds / 60)} min left`;
}

/**
 * The progress line of a running save: "Embedding 120 of 340", and, when the host
 * sends job-wide figures, "· source 2 of 5: manual.pdf · 85 passages · about 30 s left".
 * @param {{state?: string, stage?: string, done?: number, total?: number, sources_done?: number,
 *   sources_total?: number, current?: string, passages?: number, eta_s?: number | null}} job
 */
export function progressText(job) {
  if (job.state === "capturing") return "Reading the page…";
  // Built once, on first use: no count to show, and no rate yet to make an ETA from.
  if (job.stage === "model" && (job.done ?? 0) < (job.total ?? 1)) {
    return "Preparing the embedding model (built once, on first use; about a minute)…";
  }
  const label = STAGE_LABELS[/** @type {keyof typeof STAGE_LABELS} */ (job.stage)] ?? "Saving";
  const parts = [job.total ? `${label} ${job.done ?? 0} of ${job.total}` : `${label}…`];
  if (Number.isInteger(job.sources_total) && /** @type {number} */ (job.sources_total) > 1) {
    const at = Math.min(/** @type {number} */ (job.sources_done ?? 0) + 1, /** @type {number} */ (job.sources_total));
    parts.push(`source ${at} of ${job.sources_total}${job.current ? `: ${job.current}` : ""}`);
  } else if (job.current) {
    parts.push(job.current);
  }
  if (Number.isInteger(job.passages) && /** @type {number} */ (job.passages) > 0) {
    parts.push(plural(/** @type {number} */ (job.passages), "passage", "passages"));
  }
  if (typeof job.eta_s === "number" && Number.isFinite(job.eta_s)) parts.push(eta(job.eta_s));
  return parts.join(SEP);
}

/**
 * What tells apart items whose labels would show the same prefix (chips, saves and picker rows
 * truncate at the end): for each such group the first detail whose values differ (a host, a
 * path, a passage number), or, where the labels differ only past the prefix, their differing
 * ends. "" where the label alone tells an item apart.
 * @param {{label: string, details: string[]}[]} items
 * @param {number} [prefix] the characters a label shows before it is cut
 * @returns {string[]}
 */
export function tellApart(items, prefix = 24) {
  const out = items.map(() => "");
  /** @type {Map<string, number[]>} */
  const groups = new Map();
  items.forEach((item, i) => {
    const key = item.label.slice(0, prefix).toLowerCase();
    groups.set(key, [...(groups.get(key) ?? []), i]);
  });
  for (const group of groups.values()) {
    if (group.length < 2) continue;
    const labels = group.map((i) => items[i].label);
    if (new Set(labels).size === labels.length) {
      let common = 0;
      while (labels.every((l) => l[common] !== undefined && l[common] === labels[0][common])) common += 1;
      const from = Math.max(0, labels[0].lastIndexOf(" ", common) + 1);
      group.forEach((i) => {
        const tail = items[i].label.slice(from);
        out[i] = `…${tail.length > 24 ? `${tail.slice(0, 23)}…` : tail}`;
      });
      continue;
    }
    const depth = Math.max(...group.map((i) => items[i].details.length));
    for (let d = 0; d < depth; d += 1) {
      const values = group.map((i) => items[i].details[d] ?? "");
      if (new Set(values).size > 1) {
        group.forEach((i, j) => {
          out[i] = values[j];
        });
        break;
      }
    }
  }
  return out;
}
