// Markdown for answers and passages: marked (vendor/, see vendor/README.md) turns
// the text into HTML, DOMPurify removes anything that could run, and the DOM that
// is left gets citation links, copy buttons on code blocks and checked links.
//
// Three layers keep model output inert: marked's renderer here escapes raw HTML
// (a model's `<script>` shows as text) and never emits an image (a remote image is
// a way to send data out); DOMPurify keeps only the tags and attributes below;
// and every remaining link is checked for an http(s)/mailto scheme once more.

import { Marked } from "./vendor/marked.esm.js";

/** Tags a rendered answer may contain; everything else is dropped by DOMPurify. */
export const ALLOWED_TAGS = Object.freeze([
  "p", "br", "hr", "h1", "h2", "h3", "h4", "h5", "h6", "strong", "em", "del", "s", "code", "pre",
  "blockquote", "ul", "ol", "li", "table", "thead", "tbody", "tr", "th", "td", "a", "span", "input",
]);
export const ALLOWED_ATTR = Object.freeze(["href", "title", "class", "data-n", "start", "align", "type", "checked", "disabled"]);

const LINK_SCHEMES = new Set(["http:", "https:", "mailto:"]);
const CITE = /^\[(\d{1,4}(?:\s*,\s*\d{1,4})*)\]/;

/**
 * @param {string} text
 * @returns {string}
 */
function escapeHtml(text) {
  return String(text).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

/**
 * Whether a link target may be opened from an answer: http(s) or mailto, nothing else.
 * @param {string | null | undefined} href
 */
export function safeHref(href) {
  if (typeof href !== "string" || !href.trim()) return false;
  try {
    return LINK_SCHEMES.has(new URL(href.trim()).protocol);
  } catch {
    return false;
  }
}

/**
 * The markdown of `text` as HTML (not yet sanitised: `renderMarkdown` does that).
 * `[n]` with a known citation number becomes `<a class="cite" data-n>`; raw HTML is
 * escaped into text; images become their alt text; unsafe links become their text.
 * @param {string} text
 * @param {{citations?: {n: number}[]}} [options]
 * @returns {string}
 */
export function markdownHtml(text, options = {}) {
  const known = new Set((options.citations ?? []).map((c) => c.n));
  const marked = new Marked({ gfm: true, breaks: true, async: false });
  marked.use({
    extensions: [
      {
        name: "cite",
        level: "inline",
        start(/** @type {string} */ src) {
          const at = src.search(/\[\d/);
          return at < 0 ? undefined : at;
        },
        tokenizer(/** @type {string} */ src) {
          const match = CITE.exec(src);
          if (!match) return undefined;
          const numbers = match[1].split(",").map((s) => Number.parseInt(s.trim(), 10));
          // Only numbers the host vouched for become links; "[2024]" stays text.
          if (!numbers.every((n) => known.has(n))) return undefined;
          return { type: "cite", raw: match[0], numbers };
        },
        renderer(/** @type {any} */ token) {
          return token.numbers.map((/** @type {number} */ n) => `<a class="cite" href="#" data-n="${n}">[${n}]</a>`).join("");
        },
      },
    ],
    renderer: {
      html(/** @type {any} */ token) {
        return escapeHtml(token.text ?? token.raw ?? "");
      },
      image(/** @type {any} */ token) {
        return escapeHtml(token.text ? `[image: ${token.text}]` : "[image]");
      },
      link(/** @type {any} */ token) {
        const inner = this.parser.parseInline(token.tokens);
        if (!safeHref(token.href)) return inner;
        const title = token.title ? ` title="${escapeHtml(token.title)}"` : "";
        return `<a href="${escapeHtml(token.href)}"${title}>${inner}</a>`;
      },
    },
  });
  return /** @type {string} */ (marked.parse(String(text ?? "")));
}

/** @type {any} */
let purifier = null;

async function loadPurifier() {
  // Imported on first use so that node's unit tests (no DOM) can load this module.
  purifier ??= (await import("./vendor/purify.es.mjs")).default;
  return purifier;
}

/** Load DOMPurify before the first synchronous render. */
export function ready() {
  return loadPurifier();
}

/**
 * Render markdown into a sanitised fragment of the current document.
 * Call `await ready()` once before the first call.
 * @param {string} text
 * @param {{citations?: {n: number, title?: string}[], onCite?: (n: number) => void, copyLabel?: string}} [options]
 * @returns {DocumentFragment}
 */
export function renderMarkdown(text, options = {}) {
  if (!purifier) throw new Error("markdown.ready() must finish before renderMarkdown");
  const html = markdownHtml(text, options);
  /** @type {DocumentFragment} */
  const fragment = purifier.sanitize(html, {
    ALLOWED_TAGS: [...ALLOWED_TAGS],
    ALLOWED_ATTR: [...ALLOWED_ATTR],
    ALLOW_DATA_ATTR: false,
    RETURN_DOM_FRAGMENT: true,
  });
  const byN = new Map((options.citations ?? []).map((c) => [c.n, c]));
  for (const a of fragment.querySelectorAll("a")) {
    const link = /** @type {HTMLAnchorElement} */ (a);
    if (link.classList.contains("cite") && byN.has(Number(link.dataset.n))) {
      const n = Number(link.dataset.n);
      link.setAttribute("aria-label", `Citation ${n}: ${byN.get(n)?.title ?? "passage"}`);
      // Not a Tab stop: every citation is also a button in the sources row under the answer,
      // so the keyboard reaches each source once instead of once per [n] in the text.
      link.tabIndex = -1;
      link.addEventListener("click", (e) => {
        e.preventDefault();
        options.onCite?.(n);
      });
    } else if (safeHref(link.getAttribute("href"))) {
      link.target = "_blank";
      link.rel = "noopener noreferrer";
    } else {
      link.replaceWith(...link.childNodes);
    }
  }
  for (const box of fragment.querySelectorAll("input")) {
    // Task-list boxes from "- [x]" are shown, never edited.
    if (/** @type {HTMLInputElement} */ (box).type !== "checkbox") box.remove();
    else /** @type {HTMLInputElement} */ (box).disabled = true;
  }
  for (const pre of fragment.querySelectorAll("pre")) {
    const code = pre.querySelector("code");
    const lang = /language-([\w+#.-]+)/.exec(code?.className ?? "")?.[1] ?? "";
    const wrap = document.createElement("div");
    wrap.className = "code-block";
    const head = document.createElement("div");
    head.className = "code-head";
    const label = document.createElement("span");
    label.textContent = lang || "code";
    const copy = document.createElement("button");
    copy.type = "button";
    copy.className = "small copy-code";
    copy.textContent = options.copyLabel ?? "Copy";
    copy.setAttribute("aria-label", `Copy this ${lang || "code"} block`);
    copy.addEventListener("click", () => copyText(pre.innerText.replace(/\n$/, ""), copy));
    head.append(label, copy);
    pre.replaceWith(wrap);
    wrap.append(head, pre);
  }
  for (const table of fragment.querySelectorAll("table")) {
    // Wide tables scroll inside their own box instead of widening the panel.
    const wrap = document.createElement("div");
    wrap.className = "table-scroll";
    table.replaceWith(wrap);
    wrap.append(table);
  }
  return fragment;
}

/**
 * Copy text to the clipboard and say so on the button for a moment.
 * @param {string} text
 * @param {HTMLElement} button
 */
export async function copyText(text, button) {
  const before = button.textContent;
  try {
    await navigator.clipboard.writeText(text);
    button.textContent = "Copied";
  } catch {
    button.textContent = "Copy failed";
  }
  button.dataset.copied = "true";
  setTimeout(() => {
    button.textContent = before;
    delete button.dataset.copied;
  }, 1500);
}
