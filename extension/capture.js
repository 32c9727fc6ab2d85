// Capture: turn a tab, a selection or a link into the data of a `source.add`
// request. Pages are read from the rendered tab itself (chrome.scripting), so
// pages behind a sign-in work; PDFs are fetched with the user's session and
// sent as base64 bytes. Host access is optional: it is requested only when a
// fetch needs it.

import { bytesToBase64 } from "./parts.js";
import { textFragmentUrl } from "./fragments.js";

/** PDFs larger than this are refused before they cross the port. */
export const MAX_PDF_BYTES = 48 * 1024 * 1024;
/** Rendered HTML longer than this (in UTF-16 units) is refused. */
export const MAX_HTML_CHARS = 24 * 1024 * 1024;

/** A capture that could not start or finish; `code` is stable, `message` is for the user. */
export class CaptureError extends Error {
  /**
   * @param {"no_access"|"not_capturable"|"too_large"|"fetch_failed"|"unsupported_type"|"empty"} code
   * @param {string} message
   * @param {Record<string, unknown>} [detail]
   */
  constructor(code, message, detail) {
    super(message);
    this.name = "CaptureError";
    this.code = code;
    this.detail = detail ?? {};
  }
}

/**
 * @typedef {object} Snapshot  what the page itself reports
 * @property {string} url
 * @property {string} title
 * @property {string} html
 * @property {string | null} canonical_url
 * @property {string | null} lang
 * @property {string} contentType
 * @property {string} selection
 */

/**
 * Runs inside the page (chrome.scripting serialises it), so it must not use
 * anything from this module's scope.
 * @returns {Snapshot}
 */
export function pageSnapshot() {
  const root = document.documentElement;
  const canonical = document.querySelector('link[rel~="canonical"]');
  const langMeta = document.querySelector('meta[http-equiv="content-language" i]');
  const doctype = document.doctype ? `<!DOCTYPE ${document.doctype.name}>\n` : "";
  return {
    url: location.href,
    title: document.title,
    html: doctype + (root ? root.outerHTML : ""),
    canonical_url: canonical instanceof HTMLLinkElement && canonical.href ? canonical.href : null,
    lang: root?.lang || langMeta?.getAttribute("content") || null,
    contentType: document.contentType,
    selection: String(globalThis.getSelection?.() ?? ""),
  };
}

/**
 * Runs inside the page: fetches `url` as the page would (its cookies, its
 * origin), for same-site PDFs and links when the extension has no host access.
 * @param {string} url
 * @param {number} maxBytes
 * @returns {Promise<{ok: boolean, status?: number, error?: string, contentType?: string, finalUrl?: string, base64?: string, size?: number}>}
 */
export async function fetchInPage(url, maxBytes) {
  try {
    const res = await fetch(url, { credentials: "include" });
    if (!res.ok) return { ok: false, status: res.status, error: `HTTP ${res.status}` };
    const bytes = new Uint8Array(await res.arrayBuffer());
    if (bytes.length > maxBytes) return { ok: false, error: "too_large", size: bytes.length };
    let binary = "";
    for (let at = 0; at < bytes.length; at += 0x8000) {
      binary += String.fromCharCode(...bytes.subarray(at, at + 0x8000));
    }
    return {
      ok: true,
      contentType: res.headers.get("content-type") ?? "",
      finalUrl: res.url,
      base64: btoa(binary),
      size: bytes.length,
    };
  } catch (err) {
    return { ok: false, error: String(/** @type {Error} */ (err)?.message ?? err) };
  }
}

/**
 * Whether the browser lets an extension read this URL at all.
 * @param {string | undefined} url
 */
export function isCapturableUrl(url) {
  return typeof url === "string" && /^(https?|file):/i.test(url);
}

/**
 * Whether a URL names a PDF by its path (query and fragment ignored).
 * @param {string | undefined} url
 */
export function looksLikePdfUrl(url) {
  if (!url) return false;
  try {
    return /\.pdf$/i.test(new URL(url).pathname);
  } catch {
    return false;
  }
}

/**
 * Whether bytes are a PDF: the `%PDF-` header within the first KiB, where
 * readers accept it.
 * @param {Uint8Array} bytes
 */
export function isPdfBytes(bytes) {
  const head = bytes.subarray(0, 1024);
  for (let i = 0; i + 5 <= head.length; i += 1) {
    if (head[i] === 0x25 && head[i + 1] === 0x50 && head[i + 2] === 0x44 && head[i + 3] === 0x46 && head[i + 4] === 0x2d) {
      return true;
    }
  }
  return false;
}

/**
 * The match pattern for a URL's origin, as chrome.permissions wants it.
 * Match patterns carry no port, so this covers every port of the host.
 * @param {string} url
 */
export function originPattern(url) {
  const u = new URL(url);
  if (u.protocol === "file:") return "file:///*";
  return `${u.protocol}//${u.hostname}/*`;
}

/**
 * A readable title for a source that has none: the file name of its URL.
 * @param {string} url
 */
export function titleFromUrl(url) {
  try {
    const u = new URL(url);
    const last = u.pathname.split("/").filter(Boolean).pop();
    return last ? decodeURIComponent(last) : u.hostname;
  } catch {
    return url;
  }
}

/**
 * The charset a Content-Type header names, for decoding fetched HTML.
 * @param {string} contentType
 */
export function charsetOf(contentType) {
  const m = /charset\s*=\s*"?([\w.:-]+)"?/i.exec(contentType ?? "");
  return m ? m[1].toLowerCase() : "utf-8";
}

/**
 * @typedef {object} SourcePayload  the data of a `source.add` request, without kb and captured_by
 * @property {string} url
 * @property {string} [title]
 * @property {string} [html]
 * @property {string} [text]
 * @property {string} [pdf_base64]
 * @property {string} [canonical_url]
 * @property {string} [lang]
 */

/**
 * The `source.add` payload for a page snapshot.
 * @param {Snapshot} snap
 * @returns {SourcePayload}
 */
export function pagePayload(snap) {
  if (!snap.html || snap.html.length > MAX_HTML_CHARS) {
    throw new CaptureError(
      snap.html ? "too_large" : "empty",
      snap.html ? "This page is too large to save." : "This page has no content to save.",
    );
  }
  /** @type {SourcePayload} */
  const out = { url: snap.url, title: snap.title || titleFromUrl(snap.url), html: snap.html };
  if (snap.canonical_url && snap.canonical_url !== snap.url) out.canonical_url = snap.canonical_url;
  if (snap.lang) out.lang = snap.lang;
  return out;
}

/**
 * The payload for a selection: its own source, addressed by a text fragment
 * of the page, so it links straight back to the selected words and a later
 * "Save page" of the same URL does not replace it.
 * @param {{url: string, title?: string, lang?: string | null}} page
 * @param {string} selection
 * @returns {SourcePayload}
 */
export function selectionPayload(page, selection) {
  const text = (selection ?? "").trim();
  if (!text) throw new CaptureError("empty", "Nothing is selected.");
  /** @type {SourcePayload} */
  const out = {
    url: textFragmentUrl(page.url, text),
    title: `${page.title || titleFromUrl(page.url)} (selection)`,
    text,
  };
  if (page.lang) out.lang = page.lang;
  return out;
}

// ---- browser side (uses chrome.*) ------------------------------------------

/**
 * Whether an executeScript failure means "no access to this page".
 * @param {unknown} err
 */
function isAccessError(err) {
  return /cannot access|permission|must request|cannot be scripted|chrome:\/\//i.test(
    String(/** @type {Error} */ (err)?.message ?? err),
  );
}

/**
 * Read the rendered page of a tab.
 * @param {number} tabId
 * @returns {Promise<Snapshot>}
 */
export async function snapshotTab(tabId) {
  try {
    const [frame] = await chrome.scripting.executeScript({ target: { tabId }, func: pageSnapshot });
    if (!frame?.result) throw new CaptureError("not_capturable", "The page did not answer.");
    return /** @type {Snapshot} */ (frame.result);
  } catch (err) {
    if (err instanceof CaptureError) throw err;
    if (isAccessError(err)) {
      throw new CaptureError("no_access", "LocalKB may not read this page. Allow access to the site and try again.");
    }
    throw new CaptureError("not_capturable", `The page could not be read: ${/** @type {Error} */ (err).message}`);
  }
}

/**
 * @typedef {object} Fetched
 * @property {Uint8Array} bytes
 * @property {string} contentType
 * @property {string} finalUrl
 */

/**
 * Fetch a URL with the user's session. With host access for its origin the
 * extension fetches it; without, the page in `tabId` fetches it (same-site
 * links and PDFs need no extra permission); failing both, host access is
 * requested (which Chrome allows only during a user gesture).
 * @param {string} url
 * @param {{tabId?: number}} [where]
 * @returns {Promise<Fetched>}
 */
export async function fetchWithSession(url, where = {}) {
  if (!/^https?:/i.test(url)) {
    throw new CaptureError("not_capturable", "Only http and https links can be fetched.");
  }
  const origins = [originPattern(url)];
  let granted = await chrome.permissions.contains({ origins }).catch(() => false);
  if (!granted && where.tabId !== undefined) {
    const inPage = await chrome.scripting
      .executeScript({ target: { tabId: where.tabId }, func: fetchInPage, args: [url, MAX_PDF_BYTES] })
      .then(([frame]) => frame?.result)
      .catch(() => null);
    if (inPage?.ok && inPage.base64 !== undefined) {
      const binary = atob(inPage.base64);
      const bytes = new Uint8Array(binary.length);
      for (let i = 0; i < binary.length; i += 1) bytes[i] = binary.charCodeAt(i);
      return { bytes, contentType: inPage.contentType ?? "", finalUrl: inPage.finalUrl || url };
    }
    if (inPage?.error === "too_large") throw tooLarge(inPage.size);
    if (inPage?.status) throw new CaptureError("fetch_failed", `The server answered ${inPage.status} for ${url}.`);
  }
  if (!granted) {
    granted = await chrome.permissions.request({ origins }).catch(() => false);
  }
  if (!granted) {
    throw new CaptureError(
      "no_access",
      `LocalKB needs access to ${new URL(url).hostname} to fetch this file. Allow it and try again.`,
      { origins },
    );
  }
  let res;
  try {
    res = await fetch(url, { credentials: "include" });
  } catch (err) {
    throw new CaptureError("fetch_failed", `Could not fetch ${url}: ${/** @type {Error} */ (err).message}`);
  }
  if (!res.ok) throw new CaptureError("fetch_failed", `The server answered ${res.status} for ${url}.`);
  const declared = Number(res.headers.get("content-length") ?? "0");
  if (declared > MAX_PDF_BYTES) throw tooLarge(declared);
  const bytes = new Uint8Array(await res.arrayBuffer());
  if (bytes.length > MAX_PDF_BYTES) throw tooLarge(bytes.length);
  return { bytes, contentType: res.headers.get("content-type") ?? "", finalUrl: res.url || url };
}

/** @param {number | undefined} size */
function tooLarge(size) {
  const mb = (n) => `${Math.round(n / (1024 * 1024))} MB`;
  return new CaptureError(
    "too_large",
    `This file is ${size ? mb(size) : "too large"}; LocalKB saves files up to ${mb(MAX_PDF_BYTES)}.`,
  );
}

/**
 * The payload for fetched bytes: a PDF as base64, HTML as text for the
 * host's extractor, plain text as text.
 * @param {Fetched} fetched
 * @param {string} [title]
 * @returns {SourcePayload}
 */
export function fetchedPayload(fetched, title) {
  const type = fetched.contentType.toLowerCase();
  const url = fetched.finalUrl;
  if (isPdfBytes(fetched.bytes) || type.includes("application/pdf")) {
    if (!isPdfBytes(fetched.bytes)) {
      throw new CaptureError("unsupported_type", "The server called this a PDF, but it is not one.");
    }
    return { url, title: title || titleFromUrl(url), pdf_base64: bytesToBase64(fetched.bytes) };
  }
  const text = new TextDecoder(charsetOf(type), { fatal: false }).decode(fetched.bytes);
  if (type.includes("html") || /^\s*<(!doctype|html)/i.test(text)) {
    /** @type {SourcePayload} */
    const out = { url, html: text };
    if (title) out.title = title;
    return out;
  }
  if (type.startsWith("text/")) return { url, title: title || titleFromUrl(url), text };
  throw new CaptureError("unsupported_type", `LocalKB saves pages, text and PDFs, not ${type || "this file type"}.`);
}

/**
 * Capture the page in a tab: the rendered page, or the PDF it shows.
 * @param {{id: number, url?: string, title?: string}} tab
 * @returns {Promise<SourcePayload>}
 */
export async function captureTab(tab) {
  if (tab.url !== undefined && !isCapturableUrl(tab.url)) {
    throw new CaptureError("not_capturable", "Browser pages cannot be saved; open a web page or a PDF.");
  }
  if (looksLikePdfUrl(tab.url)) {
    return fetchedPayload(await fetchWithSession(/** @type {string} */ (tab.url), { tabId: tab.id }), tab.title);
  }
  const snap = await snapshotTab(tab.id);
  if (snap.contentType === "application/pdf") {
    return fetchedPayload(await fetchWithSession(snap.url, { tabId: tab.id }), tab.title);
  }
  return pagePayload(snap);
}

/**
 * Capture the selected text of a tab (the whole selection, which the context
 * menu's `selectionText` may have cut short).
 * @param {{id: number, url?: string, title?: string}} tab
 * @param {string} [fallbackText] the context menu's selectionText
 * @returns {Promise<SourcePayload>}
 */
export async function captureSelection(tab, fallbackText) {
  let snap = null;
  try {
    snap = await snapshotTab(tab.id);
  } catch (err) {
    if (!fallbackText || !tab.url) throw err;
  }
  const page = { url: snap?.url ?? /** @type {string} */ (tab.url), title: snap?.title ?? tab.title, lang: snap?.lang };
  const selected = snap?.selection?.trim() ? snap.selection : (fallbackText ?? "");
  return selectionPayload(page, selected);
}

/**
 * Capture what a link points to: a PDF, a page or a text file.
 * @param {string} linkUrl
 * @param {{tabId?: number, title?: string}} [where]
 * @returns {Promise<SourcePayload>}
 */
export async function captureLink(linkUrl, where = {}) {
  return fetchedPayload(await fetchWithSession(linkUrl, { tabId: where.tabId }), where.title);
}
