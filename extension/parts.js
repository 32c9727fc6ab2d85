// Large payloads cross the native port in numbered parts: Chrome refuses any
// host -> browser message over 1 MiB, so the host splits a big result into
// `part` events and ends with `{"parts": n}`. This module puts them back
// together, and splits uploads (an .awkb import) the other way. Pure: no
// chrome.* here, so it runs under `node --test`.

/**
 * @typedef {{index: number, count: number, data: string}} Part
 */

/** Raised when parts are missing, duplicated with other content, or disagree on the count. */
export class PartError extends Error {
  /** @param {string} message */
  constructor(message) {
    super(message);
    this.name = "PartError";
    this.code = "protocol_error";
  }
}

/** Collects the parts of one reply, in any order, and joins them in index order. */
export class PartAssembler {
  /** @type {Map<number, string>} */
  #chunks = new Map();
  /** @type {number | null} */
  #count = null;

  /**
   * Add one part event's data.
   * @param {Part} part
   */
  add(part) {
    const { index, count, data } = part ?? /** @type {any} */ ({});
    if (!Number.isInteger(count) || count < 1) {
      throw new PartError(`part count must be a positive integer, got ${JSON.stringify(count)}`);
    }
    if (!Number.isInteger(index) || index < 0 || index >= count) {
      throw new PartError(`part index ${JSON.stringify(index)} is outside 0..${count - 1}`);
    }
    if (typeof data !== "string") {
      throw new PartError(`part ${index} carries no string data`);
    }
    if (this.#count !== null && this.#count !== count) {
      throw new PartError(`part ${index} says ${count} parts, earlier parts said ${this.#count}`);
    }
    const seen = this.#chunks.get(index);
    if (seen !== undefined && seen !== data) {
      throw new PartError(`part ${index} arrived twice with different data`);
    }
    this.#count = count;
    this.#chunks.set(index, data);
  }

  /** How many distinct parts have arrived. */
  get received() {
    return this.#chunks.size;
  }

  /** The announced number of parts, or null before the first part. */
  get count() {
    return this.#count;
  }

  /** True when every announced part is here. */
  get complete() {
    return this.#count !== null && this.#chunks.size === this.#count;
  }

  /**
   * The joined string. `expected` is the count from the final reply; a
   * mismatch with what arrived is an error, never a silently short payload.
   * @param {number} [expected]
   * @returns {string}
   */
  text(expected) {
    const count = expected ?? this.#count ?? 0;
    if (this.#count !== null && expected !== undefined && expected !== this.#count) {
      throw new PartError(`the reply announced ${expected} parts, the part events said ${this.#count}`);
    }
    if (count === 0) throw new PartError("no part arrived");
    const missing = [];
    for (let i = 0; i < count; i += 1) {
      if (!this.#chunks.has(i)) missing.push(i);
    }
    if (missing.length > 0) {
      const list = missing.length > 8 ? `${missing.slice(0, 8).join(", ")}, …` : missing.join(", ");
      throw new PartError(`${missing.length} of ${count} parts missing (${list})`);
    }
    const out = [];
    for (let i = 0; i < count; i += 1) out.push(/** @type {string} */ (this.#chunks.get(i)));
    return out.join("");
  }

  /**
   * The joined payload parsed as JSON.
   * @param {number} [expected]
   * @returns {any}
   */
  json(expected) {
    const text = this.text(expected);
    try {
      return JSON.parse(text);
    } catch (err) {
      throw new PartError(`the reassembled payload is not JSON: ${/** @type {Error} */ (err).message}`);
    }
  }
}

/**
 * True when a final reply's result stands for a payload sent in parts.
 * @param {unknown} result
 * @returns {result is {parts: number}}
 */
export function isPartsResult(result) {
  return (
    typeof result === "object" &&
    result !== null &&
    !Array.isArray(result) &&
    Object.keys(result).length === 1 &&
    Number.isInteger(/** @type {any} */ (result).parts) &&
    /** @type {any} */ (result).parts >= 1
  );
}

/**
 * Split bytes into chunks of at most `size` bytes (views, not copies).
 * @param {Uint8Array} bytes
 * @param {number} size
 * @returns {Uint8Array[]}
 */
export function splitBytes(bytes, size) {
  if (!Number.isInteger(size) || size < 1) throw new RangeError("size must be a positive integer");
  const out = [];
  for (let at = 0; at < bytes.length; at += size) out.push(bytes.subarray(at, at + size));
  if (out.length === 0) out.push(bytes.subarray(0, 0));
  return out;
}

/**
 * Base64 of bytes. Works in a service worker (no Buffer), in slices so that
 * String.fromCharCode never gets more arguments than the engine allows.
 * @param {Uint8Array} bytes
 * @returns {string}
 */
export function bytesToBase64(bytes) {
  const slice = 0x8000;
  let binary = "";
  for (let at = 0; at < bytes.length; at += slice) {
    binary += String.fromCharCode(...bytes.subarray(at, at + slice));
  }
  return btoa(binary);
}

/**
 * Bytes of a base64 string; throws on characters outside the alphabet.
 * @param {string} b64
 * @returns {Uint8Array}
 */
export function base64ToBytes(b64) {
  const binary = atob(b64);
  const out = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i += 1) out[i] = binary.charCodeAt(i);
  return out;
}
