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
 * The words of one line, without leading/trailing tokens that carry no
 * letter or digit (list bullets, heading marks, stray dashes): those are
 * often produced by extraction and are not in the page's visible text.
 * @param {string} line
 * @returns {string[]}
 */
function lineWords(line) {
  const words = line.split(/\s+/).filter(Boolean);
  let start = 0;
  let end = words.length;
  while (start < end && !HAS_WORD_CHAR.test(words[start])) start += 1;
  while (end > start && !HAS_WORD_CHAR.test(words[end - 1])) end -= 1;
  return words.slice(start, end);
}

/**
 * The text directive (without `#:~:`) that finds `passage` in a page, or
 * null when the passage has no words.
 *
 * A start term is taken from the first line and an end term from the last,
 * because a single term cannot match across block boundaries. On long
 * passages the outermost word at each end is dropped: chunk edges can cut a
 * word in two, and a fragment term only matches whole words.
 * @param {string} passage
 * @returns {string | null}
 */
export function textDirective(passage) {
  const lines = String(passage ?? "")
    .split(/\r?\n/)
    .map(lineWords)
    .filter((w) => w.length > 0);
  if (lines.length === 0) return null;
  const first = lines[0];
  const last = lines[lines.length - 1];
  if (lines.length === 1 && first.length <= EXACT_MAX_WORDS) {
    return `text=${encodeTextTerm(first.join(" "))}`;
  }
  const startWords = first.length > EDGE_WORDS + 1 ? first.slice(1, EDGE_WORDS + 1) : first;
  const endWords = last.length > EDGE_WORDS + 1 ? last.slice(-EDGE_WORDS - 1, -1) : last;
  if (lines.length === 1 && first.length <= 2 * EDGE_WORDS + 2) {
    // Start and end would overlap: one exact term of the inner words is both.
    return `text=${encodeTextTerm(first.slice(1, -1).join(" "))}`;
  }
  return `text=${encodeTextTerm(startWords.join(" "))},${encodeTextTerm(endWords.join(" "))}`;
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
 * @returns {string}
 */
export function textFragmentUrl(url, passage) {
  const directive = textDirective(passage);
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
 * @param {{url?: string | null, page?: number | null, text?: string | null}} passage
 * @returns {string | null}
 */
export function sourceLink(passage) {
  const url = passage?.url;
  if (typeof url !== "string" || !/^(https?|file):/i.test(url)) return null;
  if (Number.isInteger(passage.page) && /** @type {number} */ (passage.page) >= 1) {
    return pdfPageUrl(url, /** @type {number} */ (passage.page));
  }
  if (passage.text) return textFragmentUrl(url, passage.text);
  return url;
}
