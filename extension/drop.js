// The side panel's file drop: a drop target over the whole panel while files are dragged
// over it, and "Add files…" (a file input) for the keyboard. Each file becomes one save
// job in the service worker, exactly like "Add this tab": the same save line, bar and
// Saves list, and the host's own report or refusal.

import { el } from "./dom.js";
import { putFile } from "./files.js";

/**
 * @typedef {object} DropOptions
 * @property {() => {id: string | undefined, name: string}} target the knowledge base chosen in "to"
 * @property {(text: string) => void} notice shows a message that is not a job's
 */

/**
 * Hand files to the worker, one save job each.
 * @param {Iterable<File>} files
 * @param {string | undefined} kb
 * @returns {Promise<number>} how many were handed over
 */
export async function addFiles(files, kb) {
  let handed = 0;
  for (const file of files) {
    const key = crypto.randomUUID();
    await putFile(key, file);
    // Not awaited: the reply comes when the save ends, and the job list shows it meanwhile.
    chrome.runtime.sendMessage({
      type: "save-file",
      kb,
      file: { key, name: file.name || "file", mime: file.type || undefined, size: file.size },
    }).catch(() => {});
    handed += 1;
  }
  return handed;
}

/**
 * Whether a drag carries files (not text or a link dragged from a page).
 * @param {DragEvent} e
 */
function carriesFiles(e) {
  return Boolean(e.dataTransfer && [...e.dataTransfer.types].includes("Files"));
}

/**
 * Wire the drop target and the "Add files…" button (`#add-files`, `#add-files-input`).
 * @param {DropOptions} options
 */
export function setupDrop(options) {
  const label = el("p", { class: "drop-label" });
  const overlay = el("div", { id: "drop-target", class: "drop-target", hidden: true, "aria-hidden": "true" }, label);
  document.body.append(overlay);
  let depth = 0; // dragenter/dragleave fire for every child crossed
  const show = (/** @type {boolean} */ on) => {
    overlay.hidden = !on;
    if (on) label.textContent = `Drop files to add them to ${options.target().name}`;
  };
  document.addEventListener("dragenter", (e) => {
    if (!carriesFiles(e)) return;
    e.preventDefault();
    depth += 1;
    show(true);
  });
  document.addEventListener("dragover", (e) => {
    if (!carriesFiles(e)) return;
    e.preventDefault(); // without this the browser opens the file instead
    if (e.dataTransfer) e.dataTransfer.dropEffect = "copy";
  });
  document.addEventListener("dragleave", () => {
    depth = Math.max(0, depth - 1);
    if (depth === 0) show(false);
  });
  document.addEventListener("drop", (e) => {
    if (!carriesFiles(e)) return;
    e.preventDefault();
    depth = 0;
    show(false);
    const files = [...(e.dataTransfer?.files ?? [])];
    if (files.length) addFiles(files, options.target().id).catch((err) => options.notice(String(err?.message ?? err)));
  });

  const input = /** @type {HTMLInputElement} */ (document.getElementById("add-files-input"));
  document.getElementById("add-files")?.addEventListener("click", () => input.click());
  input.addEventListener("change", () => {
    const files = [...(input.files ?? [])];
    input.value = ""; // the same file chosen again is a new save
    if (files.length) addFiles(files, options.target().id).catch((err) => options.notice(String(err?.message ?? err)));
  });
}
