// The knowledge-base list the context menus are built from, cached in
// chrome.storage.local by whichever context last asked the host, so the
// service worker can rebuild its menus without waking the host.

/**
 * Cache the host's knowledge bases and keep the default pointing at one that exists.
 * @param {{id: string, name: string, privacy: string}[]} kbs
 * @returns {Promise<string | null>} the default knowledge base id after the update
 */
export async function rememberKnowledgeBases(kbs) {
  const slim = kbs.map((kb) => ({ id: kb.id, name: kb.name, privacy: kb.privacy }));
  const { defaultKb } = await chrome.storage.local.get("defaultKb");
  const keep = slim.some((kb) => kb.id === defaultKb);
  const chosen = keep ? defaultKb : (slim[0]?.id ?? null);
  await chrome.storage.local.set({ kbCache: slim, defaultKb: chosen });
  return chosen;
}

/**
 * Make `id` the knowledge base the context menu's plain items save to.
 * @param {string} id
 */
export async function setDefaultKnowledgeBase(id) {
  await chrome.storage.local.set({ defaultKb: id });
}
