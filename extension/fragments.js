// Links back to the exact place a passage came from: a PDF page (`#page=N`,
// which Chrome's and Firefox's PDF viewers honour) or a text fragment
// (`#:~:text=start,end`, which scrolls to and highlights the passage).
// Pure: no chrome.* here.

/** Words taken from each end of a long passage for a `start,end` fragment. */
const EDGE_WORDS = 5;
/** A single-line passage up to this many words is matched exactly. */
const EXACT_MAX_WORDS = 10;

const HAS_WORD_CHAR = /[\p{L}\p{N}]/u;

/**
 * Percent-encode one text-directive term. encodeURIComponent leaves `-`
 * alone, but in a text directive `-` marks a prefix or suffix, so it must be
 * escaped too (as must `,` and `&`, which encodeURIComponent already does).
 * @param {string} term
 * @returns {string}
 */
export function encodeTextTerm(term) {
  return encodeURIComponent(term).replace(/-/g, "%2D");
}

/**
 * A passage line's Markdown as the page renders it: no code backticks, no
 * emphasis marks, a link's text without its address, table cells as words,
 * no ordered-list number (the browser draws it; no text fragment can match it).
 * An identifier's underscores and a lone `*` are text and stay.
 * @param {string} line
 * @returns {string}
 */
export function renderedLine(line) {
  return line
    .replace(/!?\[([^\]]*)\]\([^)\s]*(?:\s+"[^"]*")?\)/g, "$1")
    .replace(/`+([^`]*)`+/g, "$1")
    .replace(/(^|[^\w*])(\*\*|__)(?=\S)(.+?)(?<=\S)\2(?![\w*])/g, "$1$3")
    .replace(/(^|[^\w*])([*_])(?=\S)(.+?)(?<=\S)\2(?![\w*])/g, "$1$3")
    .replace(/\\([\\`*_{}[\]()#+\-.!|])/g, "$1")
    .replace(/^\s*\|/, "").replace(/\|\s*$/, "").replace(/\s\|\s/g, " ")
    .replace(/^\s*\d{1,9}[.)](?=\s)/, "");
}

/**
 * The words of one line as rendered, without leading/trailing tokens that
 * carry no letter or digit (list bullets, heading marks, stray dashes): those
 * are often produced by extraction and are not in the page's visible text.
 * @param {string} line
 * @returns {string[]}
 */
function lineWords(line) {
  const words = renderedLine(line).split(/\s+/).filter(Boolean);
  let start = 0;
  let end = words.length;
  while (start < end && !HAS_WORD_CHAR.test(words[start])) start += 1;
  while (end > start && !HAS_WORD_CHAR.test(words[end - 1])) end -= 1;
  return words.slice(start, end);
}

const HEADING = /^\s*#{1,6}\s/;

/**
 * Whether `line` is the title line the host puts in front of every passage
 * (the title, or its first ~80 characters cut at a word and ended with "…").
 * @param {string} line
 * @param {string | undefined} title
 */
function isTitleLine(line, title) {
  const t = String(title ?? "").trim();
  const l = line.trim();
  if (!t || !l) return false;
  if (l === t) return true;
  return l.endsWith("…") && t.startsWith(l.slice(0, -1).trimEnd());
}

/**
 * Start and end terms for lines of one passage body.
 * @param {string[][]} lines words per line
 * @param {boolean} wholeStart the first line starts a block (never cut by a chunk edge)
 */
function startEnd(lines, wholeStart) {
  const first = lines[0];
  const last = lines[lines.length - 1];
  if (lines.length === 1 && first.length <= EXACT_MAX_WORDS) return encodeTextTerm(first.join(" "));
  const startWords = !wholeStart && first.length > EDGE_WORDS + 1 ? first.slice(1, EDGE_WORDS + 1) : first.slice(0, EDGE_WORDS);
  const endWords = last.length > EDGE_WORDS + 1 ? last.slice(-EDGE_WORDS - 1, -1) : last;
  if (lines.length === 1 && first.length <= 2 * EDGE_WORDS + 2) {
    // Start and end would overlap: one exact term of the inner words is both.
    return encodeTextTerm((wholeStart ? first.slice(0, -1) : first.slice(1, -1)).join(" "));
  }
  return `${encodeTextTerm(startWords.join(" "))},${encodeTextTerm(endWords.join(" "))}`;
}

/**
 * The text directive (without `#:~:`) that finds `passage` in a page, or
 * null when the passage has no words.
 *
 * The terms come from the passage's body. A heading that opens the passage
 * becomes the directive's prefix (`heading-,start,end`), never its start: a
 * page's table of contents repeats its headings, and a heading as the start
 * matched there first, so the page opened at its top. The title line the host
 * puts in front of every passage is left out (pass `title`).
 *
 * A start term is taken from the first body line and an end term from the
 * last, because a single term cannot match across block boundaries. On long
 * passages the outermost word at each end is dropped (chunk edges can cut a
 * word in two, and a fragment term only matches whole words), except the
 * first word after a heading, which no chunk edge cuts.
 * @param {string} passage
 * @param {{title?: string}} [options]
 * @returns {string | null}
 */
export function textDirective(passage, options = {}) {
  let raw = String(passage ?? "").split(/\r?\n/).filter((l) => lineWords(l).length > 0);
  if (raw.length > 1 && isTitleLine(raw[0], options.title)) raw = raw.slice(1);
  if (raw.length === 0) return null;
  let prefix = "";
  let body = raw;
  if (HEADING.test(raw[0]) && raw.length > 1 && !HEADING.test(raw[1])) {
    const heading = lineWords(raw[0]);
    prefix = `${encodeTextTerm(heading.slice(-EDGE_WORDS).join(" "))}-,`;
    body = raw.slice(1);
  }
  const lines = body.map(lineWords);
  return `text=${prefix}${startEnd(lines, prefix !== "")}`;
}

/**
 * Split a URL into the part before `#` and its fragment without any fragment
 * directive (`:~:...`), which is not part of the page's own fragment.
 * @param {string} url
 * @returns {{base: string, hash: string}}
 */
function splitHash(url) {
  const at = url.indexOf("#");
  if (at < 0) return { base: url, hash: "" };
  const hash = url.slice(at + 1);
  const directive = hash.indexOf(":~:");
  return { base: url.slice(0, at), hash: directive < 0 ? hash : hash.slice(0, directive) };
}

/**
 * `url` with a text fragment that highlights `passage`; the page's own
 * fragment (an SPA route, an anchor) is kept in front of the directive.
 * Returns `url` unchanged when the passage has no words.
 * @param {string} url
 * @param {string} passage
 * @param {{title?: string}} [options] the source's title, whose line leads every passage
 * @returns {string}
 */
export function textFragmentUrl(url, passage, options = {}) {
  const directive = textDirective(passage, options);
  if (directive === null) return url;
  const { base, hash } = splitHash(url);
  return `${base}#${hash}:~:${directive}`;
}

/**
 * `url` opened at a PDF page (1-based, as the host numbers pages).
 * @param {string} url
 * @param {number} page
 * @returns {string}
 */
export function pdfPageUrl(url, page) {
  if (!Number.isInteger(page) || page < 1) throw new RangeError(`page must be >= 1, got ${page}`);
  return `${splitHash(url).base}#page=${page}`;
}

/**
 * The link a passage card shows: a PDF page when the passage has a page,
 * otherwise a text fragment of the passage; null for a source without a
 * link the browser may open (a local file path, a data: URL).
 * @param {{url?: string | null, page?: number | null, text?: string | null, title?: string | null}} passage
 * @returns {string | null}
 */
export function sourceLink(passage) {
  const url = passage?.url;
  if (typeof url !== "string" || !/^(https?|file):/i.test(url)) return null;
  if (Number.isInteger(passage.page) && /** @type {number} */ (passage.page) >= 1) {
    return pdfPageUrl(url, /** @type {number} */ (passage.page));
  }
  if (passage.text) return textFragmentUrl(url, passage.text, { title: passage.title ?? undefined });
  return url;
}
