// The side panel as a copilot for the open tab: "Chat with this page" and "Summarize"
// without saving it, and the right-click Explain / Summarize / Ask about this on a
// selection. The tab is captured exactly as "Add this tab" captures it (capture.js:
// the rendered page, signed-in pages and PDFs included) and handed to the host as
// `page.open`; the host keeps it in memory only and searches it beside the chosen
// knowledge bases as "This page". Its text reaches a cloud model only when the user
// ticks "Allow this page's text to reach …" for this chat; otherwise the host's privacy
// gate skips it like any device-only knowledge base. "Save" is an ordinary save.
//
// The panel (sidepanel.js) asks `pageRequest()` for the fields a chat request carries.

import { captureTab, selectionPayload, snapshotTab } from "./capture.js";
import { el, setChildren } from "./dom.js";

/** How long a selection may be when it becomes the question's context. */
const MAX_SELECTION_CHARS = 2000;
/** How often the panel asks how much of a long page is searchable, while it is not all. */
const PROGRESS_MS = 1000;

/**
 * @typedef {object} PageChatDeps  what the panel lends this module
 * @property {import("./native.js").NativeHost} host the panel's host (pages live in its process)
 * @property {(message: string, options?: Record<string, any>) => Promise<void>} ask
 * @property {() => {short: string, location: string | null} | null} currentModel
 * @property {(text: string) => void} flash
 */

/**
 * The page attached to this chat.
 * @type {{deps: PageChatDeps | null, page: any, tabId: number | undefined, toCloud: boolean, timer: number, busy: boolean}}
 */
const state = { deps: null, page: null, tabId: undefined, toCloud: false, timer: 0, busy: false };

const $ = (/** @type {string} */ id) => /** @type {any} */ (document.getElementById(id));

/**
 * Start once the panel is connected: wire the bar and take any right-click request waiting.
 * @param {PageChatDeps} deps
 */
export function initPageChat(deps) {
  if (state.deps) return;
  state.deps = deps;
  $("pagebar").hidden = false;
  $("page-chat").addEventListener("click", () => (state.page ? detach() : attachActiveTab()));
  $("page-summarize").addEventListener("click", () => summarizeActiveTab());
  $("page-save").addEventListener("click", () => savePage());
  $("page-cloud").addEventListener("change", (/** @type {Event} */ e) => {
    state.toCloud = /** @type {HTMLInputElement} */ (e.target).checked;
  });
  $("endpoint").addEventListener("change", () => renderAllowance());
  chrome.storage.onChanged.addListener((changes, area) => {
    if (area === "session" && changes.panelRequest?.newValue) takePanelRequest();
  });
  takePanelRequest();
  render();
}

/**
 * The chat request's page fields, the page made sure of first (a host that let it go, or
 * restarted, gets it again from the same tab). Null when no page is attached.
 * @param {string} [pageId] a page held for this one request (a selection to summarize)
 * @returns {Promise<{page: string, page_to_cloud: boolean} | null>}
 */
export async function pageRequest(pageId) {
  if (pageId) return { page: pageId, page_to_cloud: false };
  if (!state.page) return null;
  try {
    state.page = await /** @type {PageChatDeps} */ (state.deps).host.request("page.status", { page: state.page.page_id });
  } catch (err) {
    if (/** @type {any} */ (err)?.code !== "page_not_held") throw err;
    await openTab(state.tabId);
  }
  render();
  return state.page ? { page: state.page.page_id, page_to_cloud: state.toCloud && modelIsCloud() } : null;
}

/** Clear the attachment when the panel starts a new chat: the allowance was for that chat. */
export function resetPageChat() {
  state.toCloud = false;
  $("page-cloud").checked = false;
}

// ---- attaching a tab ----

/** @returns {Promise<chrome.tabs.Tab | undefined>} the active tab of the panel's window */
async function activeTab() {
  const win = await chrome.windows.getCurrent();
  const [tab] = await chrome.tabs.query({ active: true, windowId: win.id });
  return tab;
}

async function attachActiveTab() {
  const tab = await activeTab();
  await openTab(tab?.id);
}

/**
 * Capture a tab and hand it to the host (memory only). Says what went wrong, in the bar.
 * @param {number | undefined} tabId
 * @returns {Promise<boolean>}
 */
async function openTab(tabId) {
  const deps = /** @type {PageChatDeps} */ (state.deps);
  if (tabId === undefined) {
    deps.flash("There is no tab to read.");
    return false;
  }
  state.busy = true;
  render("Reading the page…");
  try {
    const tab = await chrome.tabs.get(tabId).catch(() => ({ id: tabId }));
    const payload = await captureTab(/** @type {any} */ ({ ...tab, id: tabId }));
    state.page = await deps.host.request("page.open", payload);
    state.tabId = tabId;
    watchProgress();
    return true;
  } catch (err) {
    state.page = null;
    deps.flash(`This page could not be read: ${/** @type {Error} */ (err).message}`);
    return false;
  } finally {
    state.busy = false;
    render();
  }
}

function detach() {
  const deps = /** @type {PageChatDeps} */ (state.deps);
  if (state.page) deps.host.request("page.close", { page: state.page.page_id }).catch(() => {});
  state.page = null;
  resetPageChat();
  render();
}

/** Ask the host how far a long page is, until all of it is searchable. */
function watchProgress() {
  clearTimeout(state.timer);
  if (!state.page || state.page.done) return;
  state.timer = setTimeout(async () => {
    if (!state.page) return;
    try {
      state.page = await /** @type {PageChatDeps} */ (state.deps).host.request("page.status", { page: state.page.page_id });
    } catch {
      return; // the next question opens it again
    }
    render();
    watchProgress();
  }, PROGRESS_MS);
}

// ---- summarize, explain, ask about ----

async function summarizeActiveTab() {
  if (!state.page && !(await openTab((await activeTab())?.id))) return;
  await /** @type {PageChatDeps} */ (state.deps).ask("Summarize this page", { summarize: true });
}

/**
 * A right-click request the worker left in storage.session (Explain / Summarize / Ask about
 * this on a selection), taken once.
 */
async function takePanelRequest() {
  const { panelRequest: request } = await chrome.storage.session.get("panelRequest");
  if (!request) return;
  await chrome.storage.session.remove("panelRequest");
  const deps = /** @type {PageChatDeps} */ (state.deps);
  const selection = String(request.selection ?? "").trim().slice(0, MAX_SELECTION_CHARS);
  if (!selection) return;
  if (request.kind === "summarize") {
    // The selection itself is what is summarized: held in memory like a page, never stored.
    const snap = await snapshotTab(request.tabId).catch(() => null);
    const payload = selectionPayload({ url: snap?.url ?? request.url, title: snap?.title ?? request.title }, selection);
    const held = await deps.host.request("page.open", payload);
    await deps.ask(`Summarize this selection: “${selection}”`, { summarize: true, pageId: held.page_id });
    return;
  }
  if (!(await openTab(request.tabId))) return;
  if (request.kind === "explain") {
    await deps.ask(`Explain this passage from the page: “${selection}”`);
  } else {
    const box = /** @type {HTMLTextAreaElement} */ ($("question"));
    box.value = `About this passage from the page: “${selection}”\n`;
    box.focus();
    box.setSelectionRange(box.value.length, box.value.length);
  }
}

// ---- save ----

async function savePage() {
  if (state.tabId === undefined) return;
  const button = /** @type {HTMLButtonElement} */ ($("page-save"));
  button.disabled = true;
  try {
    const kb = /** @type {HTMLSelectElement} */ ($("add-to")).value || undefined;
    const job = await chrome.runtime.sendMessage({ type: "save-tab", tabId: state.tabId, kb });
    $("page-saved").textContent = job?.text ? `${job.kbName ?? "Saved"}: ${job.text}` : (job?.error?.message ?? "");
    $("page-saved").hidden = !$("page-saved").textContent;
  } finally {
    button.disabled = false;
  }
}

// ---- drawing ----

function modelIsCloud() {
  const model = /** @type {PageChatDeps} */ (state.deps).currentModel();
  return model !== null && model.location !== "device";
}

/** The allowance shows only where it matters: a cloud (or undecided) model is chosen. */
function renderAllowance() {
  const model = state.deps?.currentModel() ?? null;
  const show = Boolean(state.page) && model !== null && model.location !== "device";
  $("page-cloud-wrap").hidden = !show;
  if (show && model) $("page-cloud-text").textContent = `Allow this page's text to reach ${model.short}`;
}

/** @param {string} [working] what is under way, shown instead of the page's line */
function render(working) {
  const page = state.page;
  const button = /** @type {HTMLButtonElement} */ ($("page-chat"));
  button.textContent = page ? "Stop using this page" : "Chat with this page";
  button.setAttribute("aria-pressed", String(Boolean(page)));
  button.disabled = state.busy;
  $("page-summarize").disabled = state.busy;
  $("page-attached").hidden = !page && !working;
  $("page-save").hidden = !page;
  setChildren(
    $("page-line"),
    working ? el("span", { class: "muted", text: working }) : null,
    page ? el("span", { class: "page-title", text: page.title || page.url || "This page", title: page.url ?? "" }) : null,
  );
  $("page-progress").textContent = page ? page.line : "";
  $("page-progress").hidden = !page;
  if (!page) $("page-saved").hidden = true;
  renderAllowance();
  const box = /** @type {HTMLTextAreaElement} */ ($("question"));
  box.dataset.placeholder ??= box.placeholder;
  box.placeholder = page
    ? "Ask about this page…  (Enter to send, Shift+Enter for a new line)"
    : /** @type {string} */ (box.dataset.placeholder);
  document.body.dataset.page = page ? (page.done ? "ready" : "reading") : "none";
}
