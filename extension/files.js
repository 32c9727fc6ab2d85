// Files added from the side panel (dropped, or chosen with "Add files…"). The panel
// hands each file to the service worker through IndexedDB (runtime messages carry JSON,
// not bytes, and a worker restart must not need the panel); the worker sends the bytes
// to the host in numbered `upload` parts (a native-messaging frame is capped) and adds
// them with `source.add {upload, file_name}`: the host reads the type from the name and
// the bytes, and refuses what it cannot read with its own reason.

import { HostError } from "./native.js";
import { bytesToBase64, splitBytes } from "./parts.js";

const DB_NAME = "localkb-files";
const STORE = "files";
/** Bytes per upload part: about 11 MB of base64 per frame, well under the 64 MiB cap. */
export const PART_BYTES = 8 * 1024 * 1024;

/** @returns {Promise<IDBDatabase>} */
function openDb() {
  return new Promise((resolve, reject) => {
    const req = indexedDB.open(DB_NAME, 1);
    req.onupgradeneeded = () => req.result.createObjectStore(STORE);
    req.onsuccess = () => resolve(req.result);
    req.onerror = () => reject(req.error);
  });
}

/**
 * Run one request against the file store.
 * @template T
 * @param {IDBTransactionMode} mode
 * @param {(store: IDBObjectStore) => IDBRequest<T>} fn
 * @returns {Promise<T>}
 */
async function withStore(mode, fn) {
  const db = await openDb();
  try {
    return await new Promise((resolve, reject) => {
      const req = fn(db.transaction(STORE, mode).objectStore(STORE));
      req.onsuccess = () => resolve(req.result);
      req.onerror = () => reject(req.error);
    });
  } finally {
    db.close();
  }
}

/**
 * Keep a file for the worker under `key` (the panel's side).
 * @param {string} key
 * @param {Blob} blob
 */
export function putFile(key, blob) {
  return withStore("readwrite", (store) => store.put(blob, key));
}

/**
 * The file kept under `key`, or undefined.
 * @param {string} key
 * @returns {Promise<Blob | undefined>}
 */
export function getFile(key) {
  return withStore("readonly", (store) => store.get(key));
}

/**
 * Forget the file kept under `key` (once its save has ended, however it ended).
 * @param {string} key
 */
export function dropFile(key) {
  return withStore("readwrite", (store) => store.delete(key));
}

/**
 * @typedef {object} DroppedFile  what the panel tells the worker about a file it kept
 * @property {string} key the IndexedDB key of its bytes
 * @property {string} name
 * @property {string} [mime]
 * @property {number} [size]
 */

/**
 * Send a kept file to the host in parts; resolves with the `source.add` fields that add it.
 * An abort (or any failure) aborts the host's upload, so no part is left behind.
 * @param {{request: (type: string, data?: any, options?: any) => Promise<any>}} host
 * @param {DroppedFile} file
 * @param {{signal?: AbortSignal, onPart?: (done: number, total: number) => void, blob?: Blob}} [options]
 *   `blob`: the bytes, when the caller has them (else they are read from IndexedDB)
 * @returns {Promise<{upload: string, file_name: string}>}
 */
export async function uploadFile(host, file, options = {}) {
  const blob = options.blob ?? (await getFile(file.key));
  if (!blob) throw new HostError("not_found", `${file.name} is no longer here to send; add it again.`);
  const { upload } = await host.request("upload", { action: "begin" });
  try {
    const bytes = new Uint8Array(await blob.arrayBuffer());
    const parts = splitBytes(bytes, PART_BYTES);
    for (const [index, part] of parts.entries()) {
      if (options.signal?.aborted) throw new HostError("cancelled", "Cancelled before the file was sent.");
      await host.request("upload", { action: "part", upload, index, data_base64: bytesToBase64(part) });
      options.onPart?.(index + 1, parts.length);
    }
  } catch (err) {
    await host.request("upload", { action: "abort", upload }).catch(() => {});
    throw err;
  }
  return { upload, file_name: file.name };
}

let turn = Promise.resolve();

/**
 * Run file saves one after another: the host holds at most a few uploads at once, and a
 * dozen dropped files should queue, not be refused as busy.
 * @template T
 * @param {() => Promise<T>} fn
 * @returns {Promise<T>}
 */
export function inTurn(fn) {
  const run = turn.then(fn, fn);
  turn = run.catch(() => {});
  return run;
}
