// Small DOM helpers shared by the side panel and the options page. Text is
// always set as text (never innerHTML): page titles and passages come from
// the web and must not become markup.

import { INSTALL_COMMAND } from "./native.js";

/**
 * Create an element. `attrs` keys starting with "on" add listeners; `class`,
 * `text`, `dataset`, `hidden` and boolean attributes are handled as expected.
 * @param {string} tag
 * @param {Record<string, any> | null} [attrs]
 * @param {...(Node | string | null | undefined | false)} children
 * @returns {HTMLElement}
 */
export function el(tag, attrs = null, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs ?? {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on") && typeof value === "function") {
      node.addEventListener(key.slice(2).toLowerCase(), value);
    } else if (key === "class") {
      node.className = value;
    } else if (key === "text") {
      node.textContent = String(value);
    } else if (key === "dataset") {
      Object.assign(node.dataset, value);
    } else if (key === "style" && typeof value === "object") {
      for (const [prop, v] of Object.entries(value)) node.style.setProperty(prop, String(v));
    } else if (value === true) {
      node.setAttribute(key, "");
    } else {
      node.setAttribute(key, String(value));
    }
  }
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child);
  }
  return node;
}

/**
 * Replace all children of `node`.
 * @param {Element} node
 * @param {...(Node | string | null | undefined | false)} children
 */
export function setChildren(node, ...children) {
  node.replaceChildren(...children.filter((c) => c !== null && c !== undefined && c !== false));
}

/**
 * One command with a Copy button.
 * @param {string} text
 */
function commandRow(text) {
  const command = el("code", { text });
  const copy = el("button", {
    type: "button",
    class: "small",
    text: "Copy",
    "aria-label": `Copy the command ${text}`,
    onclick: async () => {
      try {
        await navigator.clipboard.writeText(text);
        copy.textContent = "Copied";
      } catch {
        // Clipboard access can be refused; the command is selectable text anyway.
        getSelection()?.selectAllChildren(command);
      }
    },
  });
  return el("div", { class: "command" }, command, copy);
}

/**
 * The notice shown when the host is not installed or not reachable: what is
 * wrong, the exact commands that fix it (including how to get `localkb` at
 * all), and a button to check again.
 * @param {{code?: string, message?: string, onRetry: () => void}} options
 * @returns {HTMLElement}
 */
export function hostMissingNotice({ code, message, onRetry }) {
  const missing = code === undefined || code === "host_missing";
  const forbidden = code === "host_forbidden";
  return el(
    "section",
    { class: "host-missing", role: "alert", id: "host-missing" },
    el("h2", { text: missing ? "LocalKB's host is not installed" : "LocalKB's host is not reachable" }),
    el("p", {
      text: missing
        ? "LocalKB keeps your knowledge bases in a program on this computer, and the browser cannot find it."
        : forbidden
          ? "The host is registered for another copy of this extension (a different extension id)."
          : "LocalKB keeps your knowledge bases in a program on this computer, and it did not answer.",
    }),
    el("p", { text: "In a terminal, in the LocalKB folder (the one this extension's folder is in), install it once:" }),
    commandRow("make install"),
    el("p", { text: "then register it with your browsers:" }),
    commandRow(`.venv/bin/${INSTALL_COMMAND}`),
    el("p", { class: "muted" }, "Already installed? ", el("code", { text: `${INSTALL_COMMAND} --check` }), " says what is registered and whether it answers."),
    el("p", { class: "muted", text: "Then press Check again (after a first install, restart the browser)." }),
    message ? el("p", { class: "muted", text: `Details: ${message}` }) : null,
    el("button", { type: "button", class: "primary", text: "Check again", onclick: onRetry }),
  );
}

/**
 * A date the way people read it in a list.
 * @param {string | number | null | undefined} value ISO string or epoch seconds/ms
 */
export function formatDate(value) {
  if (value === null || value === undefined || value === "") return "–";
  let date;
  if (typeof value === "number") date = new Date(value < 1e12 ? value * 1000 : value);
  else date = new Date(value);
  if (Number.isNaN(date.getTime())) return String(value);
  return date.toLocaleString(undefined, { dateStyle: "medium", timeStyle: "short" });
}

/**
 * A byte count in KB/MB.
 * @param {number} n
 */
export function formatBytes(n) {
  if (!Number.isFinite(n)) return "–";
  if (n < 1024) return `${n} B`;
  if (n < 1024 * 1024) return `${(n / 1024).toFixed(1)} KB`;
  return `${(n / (1024 * 1024)).toFixed(1)} MB`;
}
