// The one wrapper around the native-messaging port to the LocalKB host.
//
// Every page and the service worker talk to the host through `NativeHost`:
// it numbers requests, matches replies to promises, hands `progress`/`step`/
// `token` events to the caller, reassembles payloads sent as parts, cancels,
// and reconnects after the host exits. A host that is not installed becomes
// a `HostError` with code `host_missing`, which the pages turn into the
// install instructions instead of a spinner.

import { PartAssembler, isPartsResult } from "./parts.js";

/** The native host name that `localkb install` registers. */
export const HOST_NAME = "com.localkb.host";

/** The command that installs (or repairs) the host registration. */
export const INSTALL_COMMAND = "localkb install";

/** An error reply from the host, or a failure of the port itself. */
export class HostError extends Error {
  /**
   * @param {string} code stable machine-readable code (the host's, or host_* for the port)
   * @param {string} message
   * @param {Record<string, unknown>} [detail]
   */
  constructor(code, message, detail) {
    super(message);
    this.name = "HostError";
    this.code = code;
    this.detail = detail ?? {};
  }
}

/**
 * Turn Chrome's disconnect message (runtime.lastError) into a stable code.
 * @param {string | undefined} message
 * @returns {"host_missing" | "host_forbidden" | "host_exited" | "host_disconnected"}
 */
export function disconnectCode(message) {
  const text = message ?? "";
  // Chrome: "Specified native messaging host not found."; Firefox: "No such native application …".
  if (/not found|no such native application/i.test(text)) return "host_missing";
  if (/forbidden/i.test(text)) return "host_forbidden";
  if (/exited/i.test(text)) return "host_exited";
  return "host_disconnected";
}

/** @type {Record<string, string>} */
const DISCONNECT_MESSAGES = {
  host_missing: `LocalKB's host is not installed. Run \`${INSTALL_COMMAND}\`, then reopen this page.`,
  host_forbidden: `The LocalKB host is registered for another extension id. Run \`${INSTALL_COMMAND}\` again.`,
  host_exited: "The LocalKB host stopped before it replied.",
  host_disconnected: "The connection to the LocalKB host was lost.",
};

/**
 * @typedef {object} Port  the part of chrome.runtime.Port this wrapper uses
 * @property {(msg: any) => void} postMessage
 * @property {() => void} disconnect
 * @property {{addListener: (fn: (msg: any) => void) => void}} onMessage
 * @property {{addListener: (fn: (port: any) => void) => void}} onDisconnect
 */

/**
 * @typedef {object} RequestOptions
 * @property {(event: string, data: any) => void} [onEvent] every event except `part`
 * @property {AbortSignal} [signal] aborting sends `cancel` to the host; the promise then
 *   settles with the host's own reply (normally a `cancelled` error)
 * @property {(id: string) => void} [onId] called with the request id once it is sent
 */

/**
 * @typedef {object} Pending
 * @property {string} type
 * @property {(value: any) => void} resolve
 * @property {(err: Error) => void} reject
 * @property {RequestOptions["onEvent"]} onEvent
 * @property {PartAssembler | null} parts
 * @property {Error | null} failure a part error, reported when the reply arrives
 */

let counter = 0;

/** A request id unique across pages and worker restarts. */
function newId() {
  counter += 1;
  const random = globalThis.crypto?.randomUUID?.() ?? Math.random().toString(36).slice(2);
  return `${counter.toString(36)}-${random}`;
}

/** A long-lived connection to the host; it connects lazily and again after the host exits. */
export class NativeHost {
  /** @type {Port | null} */
  #port = null;
  /** @type {Map<string, Pending>} */
  #pending = new Map();
  /** @type {ReturnType<typeof setTimeout> | null} */
  #idleTimer = null;
  #name;
  #connect;
  #lastError;
  #idleMs;

  /**
   * @param {object} [options]
   * @param {string} [options.name] the native host name
   * @param {(name: string) => Port} [options.connect] how to open a port (chrome.runtime.connectNative)
   * @param {() => ({message?: string} | undefined)} [options.lastError] reads chrome.runtime.lastError
   * @param {number} [options.idleMs] close the port after this long with nothing pending (0: never),
   *   so the host process exits and an idle service worker may sleep
   */
  constructor(options = {}) {
    this.#name = options.name ?? HOST_NAME;
    this.#connect = options.connect ?? ((name) => chrome.runtime.connectNative(name));
    this.#lastError = options.lastError ?? (() => globalThis.chrome?.runtime?.lastError);
    this.#idleMs = options.idleMs ?? 0;
  }

  /** Whether a port is open now. */
  get connected() {
    return this.#port !== null;
  }

  /** Open the port if it is closed. */
  #ensurePort() {
    if (this.#port) return this.#port;
    const port = this.#connect(this.#name);
    port.onMessage.addListener((msg) => this.#onMessage(msg));
    port.onDisconnect.addListener(() => this.#onDisconnect(port));
    this.#port = port;
    return port;
  }

  /**
   * Send one request and wait for its final reply.
   * @param {string} type
   * @param {Record<string, any>} [data]
   * @param {RequestOptions} [options]
   * @returns {Promise<any>} the result (reassembled when it came in parts)
   */
  request(type, data = {}, options = {}) {
    const id = newId();
    return new Promise((resolve, reject) => {
      if (options.signal?.aborted) {
        reject(new HostError("cancelled", "Cancelled before it started."));
        return;
      }
      this.#clearIdle();
      this.#pending.set(id, {
        type,
        resolve,
        reject,
        onEvent: options.onEvent,
        parts: null,
        failure: null,
      });
      try {
        this.#ensurePort().postMessage({ id, type, data });
      } catch (err) {
        this.#pending.delete(id);
        this.#port = null;
        reject(new HostError("host_disconnected", `Could not reach the LocalKB host: ${/** @type {Error} */ (err).message}`));
        return;
      }
      options.onId?.(id);
      options.signal?.addEventListener("abort", () => this.cancel(id), { once: true });
    });
  }

  /**
   * Ask the host to stop request `target`. Its own promise settles when the host replies.
   * @param {string} target
   */
  cancel(target) {
    if (!this.#pending.has(target) || !this.#port) return;
    try {
      this.#port.postMessage({ id: newId(), type: "cancel", data: { target } });
    } catch {
      // The port is gone; onDisconnect rejects the target with the reason.
    }
  }

  /** Close the port; pending requests fail with host_disconnected. */
  disconnect() {
    const port = this.#port;
    if (!port) return;
    this.#port = null;
    port.disconnect();
    this.#failAll("host_disconnected", "The connection to the LocalKB host was closed.");
  }

  /** @param {any} msg */
  #onMessage(msg) {
    if (!msg || typeof msg !== "object" || typeof msg.id !== "string") return;
    const pending = this.#pending.get(msg.id);
    if (!pending) return; // a reply to a cancel, or to a request that already failed
    if (typeof msg.event === "string") {
      this.#onEvent(pending, msg.event, msg.data);
      return;
    }
    this.#pending.delete(msg.id);
    this.#scheduleIdle();
    if (msg.ok === true) {
      if (pending.failure) {
        pending.reject(pending.failure);
        return;
      }
      try {
        pending.resolve(this.#joined(pending, msg.result));
      } catch (err) {
        pending.reject(new HostError("protocol_error", /** @type {Error} */ (err).message));
      }
      return;
    }
    const error = msg.error ?? {};
    pending.reject(
      new HostError(
        String(error.code ?? "host_error"),
        String(error.message ?? "The LocalKB host reported an error without a message."),
        error.detail,
      ),
    );
  }

  /**
   * @param {Pending} pending
   * @param {string} event
   * @param {any} data
   */
  #onEvent(pending, event, data) {
    if (event === "part") {
      if (pending.failure) return;
      try {
        pending.parts ??= new PartAssembler();
        pending.parts.add(data);
      } catch (err) {
        pending.failure = new HostError("protocol_error", /** @type {Error} */ (err).message);
      }
      return;
    }
    let payload = data;
    try {
      payload = this.#joined(pending, data);
    } catch (err) {
      pending.failure = new HostError("protocol_error", /** @type {Error} */ (err).message);
      return;
    }
    try {
      pending.onEvent?.(event, payload);
    } catch {
      // A rendering bug in one listener must not lose the reply.
    }
  }

  /**
   * The real payload of a reply or event: as sent, or, when part events came
   * before it (the host's convention: they precede the `{"parts": n}` that
   * stands in for it), the joined and parsed parts.
   * @param {Pending} pending
   * @param {any} payload
   */
  #joined(pending, payload) {
    if (pending.parts === null) return payload;
    const parts = pending.parts;
    pending.parts = null;
    if (!isPartsResult(payload)) {
      throw new Error("part events arrived, but the message after them is not {\"parts\": n}");
    }
    return parts.json(payload.parts);
  }

  /** @param {Port} port */
  #onDisconnect(port) {
    // Chrome puts the reason in runtime.lastError (reading it also keeps Chrome from logging
    // it as unchecked); Firefox puts it on the port.
    const message = this.#lastError()?.message ?? /** @type {any} */ (port).error?.message;
    if (this.#port !== port) return;
    this.#port = null;
    const code = disconnectCode(message);
    const text = DISCONNECT_MESSAGES[code] + (message && code === "host_disconnected" ? ` (${message})` : "");
    this.#failAll(code, text);
  }

  /**
   * @param {string} code
   * @param {string} message
   */
  #failAll(code, message) {
    const pending = [...this.#pending.values()];
    this.#pending.clear();
    this.#clearIdle();
    for (const p of pending) p.reject(new HostError(code, message));
  }

  #clearIdle() {
    if (this.#idleTimer !== null) clearTimeout(this.#idleTimer);
    this.#idleTimer = null;
  }

  #scheduleIdle() {
    if (this.#idleMs <= 0 || this.#pending.size > 0) return;
    this.#clearIdle();
    this.#idleTimer = setTimeout(() => {
      if (this.#pending.size === 0) this.disconnect();
    }, this.#idleMs);
  }
}
