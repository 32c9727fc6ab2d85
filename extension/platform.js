// The one place where Chromium and Firefox differ at run time. Both expose the
// promise-based `chrome.*` namespace to MV3 extensions; what differs is the
// panel (Chromium's side panel, Firefox's sidebar) and what a notification may
// carry. Everything else calls `chrome.*` directly.

/** Whether this is Firefox (its sidebar API stands in for Chromium's side panel). */
export const IS_FIREFOX = typeof globalThis.browser?.sidebarAction?.open === "function";

/**
 * Make the toolbar button open the panel: Chromium's side panel opens by itself once
 * told to; Firefox's sidebar is toggled from the button's click.
 */
export function openPanelOnActionClick() {
  if (IS_FIREFOX) {
    if (!chrome.action.onClicked.hasListener(toggleSidebar)) chrome.action.onClicked.addListener(toggleSidebar);
    return;
  }
  chrome.sidePanel?.setPanelBehavior({ openPanelOnActionClick: true }).catch(() => {});
}

function toggleSidebar() {
  globalThis.browser.sidebarAction.toggle().catch(() => {});
}

/**
 * Open the panel beside a window; call it first thing in a user gesture's handler.
 * @param {number | undefined} windowId
 * @returns {Promise<void>}
 */
export function openPanel(windowId) {
  if (IS_FIREFOX) return globalThis.browser.sidebarAction.open().catch(() => {});
  if (windowId === undefined || !chrome.sidePanel) return Promise.resolve();
  return chrome.sidePanel.open({ windowId }).catch(() => {});
}

/**
 * Notification options this browser accepts: Firefox has no buttons and no
 * progress template, so a progress note becomes a plain one there.
 * @param {chrome.notifications.NotificationOptions<true>} options
 */
export function notificationOptions(options) {
  if (!IS_FIREFOX) return options;
  const { buttons: _buttons, progress, silent: _silent, ...rest } = options;
  if (rest.type !== "progress") return rest;
  return { ...rest, type: "basic", message: `${rest.message} (${progress ?? 0}%)` };
}
