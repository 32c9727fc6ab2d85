// The service worker: context menus, the toolbar action and keyboard command,
// and every save (capture -> `source.add` -> honest report as badge and
// notification). Chrome may stop this worker whenever it is idle, so what
// must survive (the knowledge-base list for the menus, the default knowledge
// base, the progress of saves) lives in chrome.storage, never in globals.

import { CaptureError, captureLink, captureSelection, captureTab, originPattern } from "./capture.js";
import { rememberKnowledgeBases } from "./kbs.js";
import { HostError, NativeHost } from "./native.js";
import { reportBadge, reportText } from "./render.js";

const ICON = "icons/icon-128.png";
/** Saves with at least this many passages to embed get a progress notification with Cancel. */
const LONG_SAVE_PASSAGES = 48;
/** Finished saves kept for the side panel's status list. */
const KEEP_FINISHED_JOBS = 8;
/** Name of the knowledge base created when the user saves before making any. */
const FIRST_KB_NAME = "My knowledge base";

// The port and the abort controllers are caches of live work: when Chrome
// stops the worker the port closes, the host stops that work, and nothing of
// value is lost with them. The worker stays alive while the port is open.
const host = new NativeHost({ idleMs: 5 * 60 * 1000 });
/** @type {Map<string, AbortController>} */
const controllers = new Map();

/** @typedef {"page" | "selection" | "link"} SaveKind */

/** Context-menu items: one per kind, to the default KB, plus a "… to" submenu for the others. */
const MENU_KINDS = /** @type {const} */ ([
  { kind: "page", title: "Save page to LocalKB", contexts: ["page"] },
  { kind: "selection", title: "Save selection to LocalKB", contexts: ["selection"] },
  { kind: "link", title: "Save link to LocalKB", contexts: ["link"] },
]);

// ---- listeners, registered at top level so Chrome can wake the worker for them ----

chrome.runtime.onInstalled.addListener(() => {
  chrome.sidePanel.setPanelBehavior({ openPanelOnActionClick: true }).catch(() => {});
  rebuildMenus();
  refreshKnowledgeBases().catch(() => {}); // no host yet is fine: menus show the default only
});
chrome.runtime.onStartup.addListener(() => {
  refreshKnowledgeBases().catch(() => {});
});
chrome.contextMenus.onClicked.addListener((info, tab) => {
  onMenuClick(info, tab);
});
chrome.commands.onCommand.addListener((command, tab) => {
  onCommand(command, tab);
});
chrome.runtime.onMessage.addListener((message, sender, sendResponse) => {
  const handled = onPageMessage(message, sender);
  if (!handled) return false;
  handled.then(sendResponse, (err) => sendResponse({ error: errorInfo(err) }));
  return true; // the reply is sent asynchronously
});
chrome.storage.onChanged.addListener((changes, area) => {
  if (area === "local" && ("kbCache" in changes || "defaultKb" in changes)) rebuildMenus();
});
chrome.notifications.onButtonClicked.addListener((notificationId, buttonIndex) => {
  if (notificationId.startsWith("job:") && buttonIndex === 0) cancelJob(notificationId.slice(4));
});

// ---- context menus ----

let menuChain = Promise.resolve();

/**
 * Rebuild every menu item from the cached knowledge-base list. Rebuilds are
 * chained so two quick changes cannot interleave their removeAll and creates.
 * @returns {Promise<void>}
 */
export function rebuildMenus() {
  menuChain = menuChain.then(buildMenus, buildMenus);
  return menuChain;
}

/**
 * @param {chrome.contextMenus.CreateProperties} props
 * @returns {Promise<void>}
 */
function createMenu(props) {
  return new Promise((resolve) => {
    chrome.contextMenus.create(props, () => {
      void chrome.runtime.lastError; // a duplicate id after a race is harmless
      resolve();
    });
  });
}

async function buildMenus() {
  const { kbCache = [], defaultKb = null } = await chrome.storage.local.get(["kbCache", "defaultKb"]);
  const defaultId = defaultKb ?? kbCache[0]?.id ?? null;
  const others = kbCache.filter((/** @type {{id: string}} */ kb) => kb.id !== defaultId);
  await chrome.contextMenus.removeAll();
  for (const { kind, title, contexts } of MENU_KINDS) {
    await createMenu({ id: `save-${kind}`, title, contexts: [...contexts] });
    if (others.length === 0) continue;
    const parentId = `save-${kind}-to`;
    await createMenu({ id: parentId, title: `${title.replace(" to LocalKB", "")} to…`, contexts: [...contexts] });
    for (const kb of others) {
      await createMenu({ id: `save-${kind}@${kb.id}`, parentId, title: kb.name, contexts: [...contexts] });
    }
  }
  await createMenu({ id: "save-tab", title: "Add this tab to LocalKB", contexts: ["action"] });
  for (const { kind, title } of ASK_KINDS) await createMenu({ id: `ask-${kind}`, title, contexts: ["selection"] });
}

/**
 * What a context-menu click does; exported (and on `self.localkb`) because it
 * is the one entry point the browser tests drive.
 * @param {chrome.contextMenus.OnClickData} info
 * @param {chrome.tabs.Tab | undefined} tab
 */
export function onMenuClick(info, tab) {
  const id = String(info.menuItemId);
  const asked = /^ask-(explain|summarize|about)$/.exec(id);
  if (asked) return askInPanel(/** @type {AskKind} */ (asked[1]), info, tab);
  const match = /^save-(page|selection|link|tab)(?:@(.+))?$/.exec(id);
  if (!match || !tab || tab.id === undefined) return Promise.resolve(null);
  const kind = /** @type {SaveKind} */ (match[1] === "tab" ? "page" : match[1]);
  return save({
    kind,
    tab,
    kb: match[2],
    capturedBy: match[1] === "tab" ? "toolbar" : "context-menu",
    linkUrl: info.linkUrl,
    selectionText: info.selectionText,
    pageUrl: info.pageUrl,
  });
}

/**
 * The keyboard commands (manifest `commands`; `_execute_action` opens the panel by itself,
 * because the action's click does). Exported for the browser tests, like onMenuClick.
 * @param {string} command
 * @param {chrome.tabs.Tab | undefined} tab
 */
export async function onCommand(command, tab) {
  if (command === "save-tab" && tab?.id !== undefined) {
    return save({ kind: "page", tab, capturedBy: "toolbar" });
  }
  if (command === "focus-question") {
    // sidePanel.open must be called while the shortcut's user gesture lasts: first thing.
    const opening = tab?.windowId !== undefined
      ? chrome.sidePanel.open({ windowId: tab.windowId }).catch(() => {})
      : Promise.resolve();
    await opening;
    // An open panel focuses its question box; a panel that is just opening does so itself.
    await chrome.runtime.sendMessage({ type: "focus-question" }).catch(() => {});
    return { focused: true };
  }
  return null;
}

// ---- a selection into the side panel (pagechat.js answers it) ----

/** @typedef {"explain" | "summarize" | "about"} AskKind */

/** Selection menu items that open the panel on the selection, grounded in the page. */
const ASK_KINDS = /** @type {const} */ ([
  { kind: "explain", title: "Explain with LocalKB" },
  { kind: "summarize", title: "Summarize with LocalKB" },
  { kind: "about", title: "Ask LocalKB about this" },
]);

/**
 * Open the side panel and leave the request where it looks (storage.session survives this
 * worker stopping; an open panel hears the change, a panel just opening reads it).
 * @param {AskKind} kind
 * @param {chrome.contextMenus.OnClickData} info
 * @param {chrome.tabs.Tab | undefined} tab
 */
function askInPanel(kind, info, tab) {
  // sidePanel.open must be called while the click's user gesture lasts: first thing.
  const opening = tab?.windowId !== undefined
    ? chrome.sidePanel.open({ windowId: tab.windowId }).catch(() => {})
    : Promise.resolve();
  const panelRequest = {
    kind, selection: info.selectionText ?? "", tabId: tab?.id, url: info.pageUrl ?? tab?.url,
    title: tab?.title, at: Date.now(),
  };
  return opening.then(() => chrome.storage.session.set({ panelRequest })).then(() => panelRequest);
}

// ---- knowledge bases ----

/**
 * Ask the host for the knowledge bases and cache them for the menus.
 * @returns {Promise<any[]>}
 */
export async function refreshKnowledgeBases() {
  const { knowledge_bases: kbs } = await host.request("kb.list");
  await rememberKnowledgeBases(kbs);
  return kbs;
}

/**
 * The knowledge base a save goes to: the one asked for, else the default,
 * else the first, else a new one (a first save should not fail for want of one).
 * @param {string | undefined} wanted
 * @returns {Promise<{id: string, name: string}>}
 */
async function targetKb(wanted) {
  const kbs = await refreshKnowledgeBases();
  if (wanted) {
    const found = kbs.find((kb) => kb.id === wanted);
    if (found) return found;
    throw new HostError("kb_not_found", "That knowledge base no longer exists.");
  }
  const { defaultKb } = await chrome.storage.local.get("defaultKb");
  const chosen = kbs.find((kb) => kb.id === defaultKb) ?? kbs[0];
  if (chosen) return chosen;
  const { knowledge_base: created } = await host.request("kb.create", { name: FIRST_KB_NAME, privacy: "device" });
  await rememberKnowledgeBases([created]);
  return created;
}

// ---- saving ----

/**
 * @typedef {object} Job  what the side panel shows of a save (in storage.session as `job:<id>`)
 * @property {string} id
 * @property {"capturing"|"saving"|"done"|"failed"} state
 * @property {string} title
 * @property {string} [url]
 * @property {string} [kbName]
 * @property {string} capturedBy
 * @property {string} [stage]
 * @property {number} [done]
 * @property {number} [total]
 * @property {string} [text] the report line or the error message
 * @property {any} [report]
 * @property {{code: string, message: string, detail?: any}} [error]
 * @property {number} startedAt
 * @property {number} [finishedAt]
 */

/**
 * @param {string} id
 * @param {Partial<Job>} patch
 * @returns {Promise<Job>}
 */
async function updateJob(id, patch) {
  const key = `job:${id}`;
  const { [key]: old } = await chrome.storage.session.get(key);
  const job = { ...(old ?? {}), ...patch };
  await chrome.storage.session.set({ [key]: job });
  return /** @type {Job} */ (job);
}

/** Drop the oldest finished jobs beyond KEEP_FINISHED_JOBS. */
async function pruneJobs() {
  const all = await chrome.storage.session.get(null);
  const finished = Object.entries(all)
    .filter(([k, v]) => k.startsWith("job:") && (v.state === "done" || v.state === "failed"))
    .sort(([, a], [, b]) => (b.finishedAt ?? 0) - (a.finishedAt ?? 0));
  const stale = finished.slice(KEEP_FINISHED_JOBS).map(([k]) => k);
  if (stale.length) await chrome.storage.session.remove(stale);
}

/**
 * @param {unknown} err
 * @returns {{code: string, message: string, detail?: any}}
 */
function errorInfo(err) {
  if (err instanceof HostError || err instanceof CaptureError) {
    return { code: err.code, message: err.message, detail: err.detail };
  }
  return { code: "internal_error", message: String(/** @type {Error} */ (err)?.message ?? err) };
}

/**
 * @param {number | undefined} tabId
 * @param {string} text
 * @param {string} color
 */
async function setBadge(tabId, text, color) {
  const where = tabId === undefined ? {} : { tabId };
  await chrome.action.setBadgeBackgroundColor({ ...where, color }).catch(() => {});
  await chrome.action.setBadgeText({ ...where, text }).catch(() => {});
}

/**
 * @param {string} id
 * @param {chrome.notifications.NotificationOptions<true>} options
 */
function notify(id, options) {
  return chrome.notifications.create(id, options).catch(() => {});
}

/**
 * @typedef {object} SaveRequest
 * @property {SaveKind} kind
 * @property {{id?: number, url?: string, title?: string}} tab
 * @property {string} [kb] knowledge-base id; the default when absent
 * @property {"context-menu"|"side-panel"|"toolbar"} capturedBy
 * @property {string} [linkUrl]
 * @property {string} [selectionText]
 * @property {string} [pageUrl] the page's address as the menu click reported it
 */

/**
 * Capture, send to the host, and tell the user what was counted. Never throws:
 * the returned job (also in storage.session) says how it ended.
 * @param {SaveRequest} request
 * @returns {Promise<Job>}
 */
export async function save(request) {
  const id = crypto.randomUUID();
  const tabId = request.tab.id;
  const controller = new AbortController();
  controllers.set(id, controller);
  let job = await updateJob(id, {
    id,
    state: "capturing",
    title: request.kind === "link"
      ? (request.linkUrl ?? "link")
      : (request.tab.title || request.tab.url || request.pageUrl || "this tab"),
    url: request.kind === "link" ? request.linkUrl : (request.tab.url ?? request.pageUrl),
    capturedBy: request.capturedBy,
    startedAt: Date.now(),
  });
  await setBadge(tabId, "…", "#5f6368");
  let progressShown = false;
  try {
    const kb = await targetKb(request.kb);
    job = await updateJob(id, { kbName: kb.name });
    /** @type {import("./capture.js").SourcePayload} */
    let payload;
    if (request.kind === "link") {
      if (!request.linkUrl) throw new CaptureError("empty", "There is no link to save.");
      payload = await captureLink(request.linkUrl, { tabId });
    } else if (request.kind === "selection") {
      payload = await captureSelection(/** @type {any} */ (request.tab), request.selectionText);
    } else {
      payload = await captureTab(/** @type {any} */ (request.tab));
    }
    job = await updateJob(id, { state: "saving", title: payload.title || job.title, url: payload.url });
    let lastWrite = 0;
    const report = await host.request(
      "source.add",
      { ...payload, kb: kb.id, captured_by: request.capturedBy },
      {
        signal: controller.signal,
        onEvent: (event, data) => {
          if (event !== "progress") return;
          const { stage, done = 0, total = 0 } = data ?? {};
          // Storage writes are cheap but not free: a write per stage change and per ~5%.
          const step = Math.max(1, Math.floor(total / 20));
          if (stage !== job.stage || done - lastWrite >= step || done === total) {
            lastWrite = done;
            job.stage = stage;
            // Job-wide figures (sources done of total, current file, passages, ETA) when the
            // host sends them; render.progressText words whatever is there.
            const wide = Object.fromEntries(
              ["sources_done", "sources_total", "current", "passages", "eta_s"]
                .filter((k) => data?.[k] !== undefined).map((k) => [k, data[k]]),
            );
            updateJob(id, { stage, done, total, ...wide });
          }
          if (stage === "embed" && total >= LONG_SAVE_PASSAGES) {
            progressShown = true;
            notify(`job:${id}`, {
              type: "progress",
              iconUrl: ICON,
              title: `Saving to ${kb.name}`,
              message: job.title,
              progress: total ? Math.round((done / total) * 100) : 0,
              buttons: [{ title: "Cancel" }],
              silent: true,
            });
          }
        },
      },
    );
    const text = reportText(report);
    const badge = reportBadge(report);
    await setBadge(tabId, badge.text, badge.color);
    // The host's title (a PDF's own title, a page's <title>) beats the URL the job started with.
    job = await updateJob(id, { state: "done", report, text, title: report.title || job.title, finishedAt: Date.now() });
    if (progressShown) await chrome.notifications.clear(`job:${id}`).catch(() => {});
    await notify(`job:${id}`, {
      type: "basic",
      iconUrl: ICON,
      title: `${report.failed ? "Partly saved" : "Saved"} to ${kb.name}`,
      message: text,
      contextMessage: report.title || job.title,
    });
  } catch (err) {
    const error = errorInfo(err);
    const url = request.kind === "link" ? request.linkUrl : (request.tab.url ?? request.pageUrl);
    if (error.code === "no_access" && !error.detail?.origins && url && /^(https?|file):/i.test(url)) {
      // The panel asks for exactly this site, never for every site.
      error.detail = { ...(error.detail ?? {}), origins: [originPattern(url)] };
    }
    await setBadge(tabId, "!", "#b3261e");
    job = await updateJob(id, { state: "failed", error, text: error.message, finishedAt: Date.now() });
    if (progressShown) await chrome.notifications.clear(`job:${id}`).catch(() => {});
    await notify(`job:${id}`, {
      type: "basic",
      iconUrl: ICON,
      title: error.code === "cancelled" ? "Save cancelled" : "Not saved",
      message: error.message,
      contextMessage: job.title,
    });
  } finally {
    controllers.delete(id);
    pruneJobs().catch(() => {});
  }
  return job;
}

/**
 * Cancel a running save, if this worker is still the one running it.
 * @param {string} id
 * @returns {boolean}
 */
export function cancelJob(id) {
  const controller = controllers.get(id);
  if (!controller) return false;
  controller.abort();
  return true;
}

// ---- messages from the side panel and the options page ----

/**
 * @param {any} message
 * @param {chrome.runtime.MessageSender} _sender
 * @returns {Promise<any> | null} null when the message is not for the worker
 */
function onPageMessage(message, _sender) {
  switch (message?.type) {
    case "save-active-tab":
      return saveActiveTab(message.windowId, message.kb);
    case "save-tab":
      return chrome.tabs.get(Number(message.tabId)).catch(() => ({ id: Number(message.tabId) }))
        .then((tab) => save({ kind: "page", tab, kb: message.kb, capturedBy: "side-panel" }));
    case "cancel-job":
      return Promise.resolve({ cancelled: cancelJob(String(message.jobId)) });
    case "kbs-changed":
      return refreshKnowledgeBases().then((kbs) => ({ count: kbs.length }));
    default:
      return null;
  }
}

/**
 * The side panel's "Add this tab".
 * @param {number | undefined} windowId
 * @param {string | undefined} kb
 */
async function saveActiveTab(windowId, kb) {
  const query = windowId === undefined ? { active: true, lastFocusedWindow: true } : { active: true, windowId };
  const [tab] = await chrome.tabs.query(query);
  if (!tab || tab.id === undefined) throw new CaptureError("not_capturable", "There is no tab to add.");
  return save({ kind: "page", tab, kb, capturedBy: "side-panel" });
}

// The browser tests (and a curious user in DevTools) reach the same entry
// points the menus use; a module's exports are not visible from outside it.
Object.assign(globalThis, {
  localkb: { save, onMenuClick, onCommand, cancelJob, refreshKnowledgeBases, rebuildMenus, host },
});
