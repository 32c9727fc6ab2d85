// The chat history: every conversation in chrome.storage.local (it survives a
// browser restart), one key per chat plus a small index for the list. Pure apart
// from the storage area it is given, so node's tests run it on an in-memory one.

/** Conversations kept; the oldest beyond this are dropped when a new one is saved. */
export const MAX_CHATS = 200;
const INDEX = "chats";
const CURRENT = "currentChat";

/**
 * @typedef {object} Chat
 * @property {string} id
 * @property {string} title
 * @property {boolean} [renamed] the user chose the title
 * @property {number} created
 * @property {number} updated
 * @property {any[]} turns
 */

/**
 * @typedef {object} StorageArea  the part of chrome.storage.StorageArea used here
 * @property {(keys: string | string[] | null) => Promise<Record<string, any>>} get
 * @property {(items: Record<string, any>) => Promise<void>} set
 * @property {(keys: string | string[]) => Promise<void>} remove
 */

/**
 * A title from the first question: its first line, cut at a word near 60 characters.
 * @param {any[]} turns
 */
export function titleFor(turns) {
  const first = String(turns?.[0]?.message ?? "").split("\n")[0].trim();
  if (!first) return "New chat";
  if (first.length <= 60) return first;
  const cut = first.slice(0, 60);
  const at = cut.lastIndexOf(" ");
  return `${(at > 30 ? cut.slice(0, at) : cut).trimEnd()}…`;
}

/** @returns {Chat} */
export function newChat() {
  const now = Date.now();
  const random = globalThis.crypto?.randomUUID?.() ?? Math.random().toString(36).slice(2);
  return { id: `c-${now.toString(36)}-${random.slice(0, 8)}`, title: "New chat", created: now, updated: now, turns: [] };
}

export class ChatStore {
  /** @param {StorageArea} area */
  constructor(area) {
    this.area = area;
  }

  /** @returns {Promise<{id: string, title: string, created: number, updated: number, questions: number}[]>} newest first */
  async list() {
    const { [INDEX]: index = [] } = await this.area.get(INDEX);
    return [...index].sort((a, b) => b.updated - a.updated);
  }

  /**
   * @param {string} id
   * @returns {Promise<Chat | null>}
   */
  async get(id) {
    const key = `chat:${id}`;
    const { [key]: chat } = await this.area.get(key);
    return chat ?? null;
  }

  /**
   * Store a chat (an empty one is not listed) and move it to the top of the list.
   * @param {Chat} chat
   */
  async save(chat) {
    chat.updated = Date.now();
    if (!chat.renamed) chat.title = titleFor(chat.turns);
    const index = (await this.list()).filter((c) => c.id !== chat.id);
    const stale = [];
    if (chat.turns.length) {
      index.unshift({ id: chat.id, title: chat.title, created: chat.created, updated: chat.updated, questions: chat.turns.length });
      while (index.length > MAX_CHATS) stale.push(/** @type {any} */ (index.pop()).id);
      await this.area.set({ [`chat:${chat.id}`]: chat, [INDEX]: index });
    } else {
      await this.area.set({ [INDEX]: index });
      stale.push(chat.id);
    }
    if (stale.length) await this.area.remove(stale.map((id) => `chat:${id}`));
  }

  /**
   * @param {string} id
   * @param {string} title
   */
  async rename(id, title) {
    const chat = await this.get(id);
    if (!chat) return null;
    chat.title = title.trim() || titleFor(chat.turns);
    chat.renamed = Boolean(title.trim());
    await this.save(chat);
    return chat;
  }

  /** @param {string} id */
  async remove(id) {
    const index = (await this.list()).filter((c) => c.id !== id);
    await this.area.set({ [INDEX]: index });
    await this.area.remove(`chat:${id}`);
    const { [CURRENT]: current } = await this.area.get(CURRENT);
    if (current === id) await this.area.remove(CURRENT);
  }

  /** The chat the panel showed last, so reopening the panel (or the browser) shows it again. */
  async current() {
    const { [CURRENT]: id } = await this.area.get(CURRENT);
    return id ? this.get(id) : null;
  }

  /** @param {string} id */
  async setCurrent(id) {
    await this.area.set({ [CURRENT]: id });
  }
}

/**
 * An in-memory storage area (node's tests; also a fallback outside the extension).
 * @returns {StorageArea}
 */
export function memoryArea() {
  /** @type {Map<string, any>} */
  const data = new Map();
  const clone = (/** @type {any} */ v) => (v === undefined ? v : JSON.parse(JSON.stringify(v)));
  return {
    async get(keys) {
      const list = keys === null ? [...data.keys()] : Array.isArray(keys) ? keys : [keys];
      return Object.fromEntries(list.filter((k) => data.has(k)).map((k) => [k, clone(data.get(k))]));
    },
    async set(items) {
      for (const [k, v] of Object.entries(items)) data.set(k, clone(v));
    },
    async remove(keys) {
      for (const k of Array.isArray(keys) ? keys : [keys]) data.delete(k);
    },
  };
}
