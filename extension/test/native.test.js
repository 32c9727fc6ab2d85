// native.js against a real host process: the product's host loop
// (localkb.host.main) run by test/fixture_host.py, spoken to with real
// native-messaging frames through a small Node adapter that behaves like
// chrome.runtime.connectNative's Port (including its disconnect messages).

import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { endianness, tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { after, test } from "node:test";
import { fileURLToPath } from "node:url";

import { HostError, NativeHost, disconnectCode } from "../native.js";

const here = dirname(fileURLToPath(import.meta.url));
const repo = join(here, "..", "..");
const venvPython = join(repo, ".venv", "bin", "python");
const python = process.env.LOCALKB_PYTHON ?? (existsSync(venvPython) ? venvPython : "python3");
const fixture = join(here, "fixture_host.py");
const home = mkdtempSync(join(tmpdir(), "localkb-native-test-"));
after(() => rmSync(home, { recursive: true, force: true }));

const hasHost = spawnSync(python, ["-c", "import localkb.native.host"], { encoding: "utf8" }).status === 0;
const skip = hasHost ? false : `the localkb package is not importable with ${python}`;

/**
 * A chrome.runtime.Port over a child process's stdio, framed as Chrome frames
 * native messages: 4-byte native-endian length, then UTF-8 JSON.
 */
function nodePort(command, args) {
  const messageListeners = [];
  const disconnectListeners = [];
  let lastError;
  let closed = false;
  const child = spawn(command, args, { env: { ...process.env, LOCALKB_HOME: home }, stdio: ["pipe", "pipe", "ignore"] });
  let buffer = Buffer.alloc(0);
  child.stdout.on("data", (chunk) => {
    buffer = Buffer.concat([buffer, chunk]);
    for (;;) {
      if (buffer.length < 4) return;
      const length = endianness() === "LE" ? buffer.readUInt32LE(0) : buffer.readUInt32BE(0);
      if (length >= 1024 * 1024) throw new Error(`host sent a ${length}-byte frame; Chrome would drop it`);
      if (buffer.length < 4 + length) return;
      const message = JSON.parse(buffer.subarray(4, 4 + length).toString("utf8"));
      buffer = buffer.subarray(4 + length);
      for (const fn of messageListeners) fn(message);
    }
  });
  const disconnect = (message) => {
    if (closed) return;
    closed = true;
    lastError = message ? { message } : undefined;
    for (const fn of disconnectListeners) fn(port);
    lastError = undefined;
  };
  child.on("error", () => disconnect("Specified native messaging host not found."));
  child.on("exit", () => disconnect("Native host has exited."));
  const port = {
    postMessage(msg) {
      if (closed) throw new Error("Attempting to use a disconnected port object");
      const body = Buffer.from(JSON.stringify(msg), "utf8");
      const header = Buffer.alloc(4);
      if (endianness() === "LE") header.writeUInt32LE(body.length);
      else header.writeUInt32BE(body.length);
      child.stdin.write(Buffer.concat([header, body]));
    },
    disconnect() {
      closed = true;
      child.stdin.end();
    },
    onMessage: { addListener: (fn) => messageListeners.push(fn) },
    onDisconnect: { addListener: (fn) => disconnectListeners.push(fn) },
    lastError: () => lastError,
  };
  return port;
}

/** A NativeHost whose ports are fixture-host processes; counts the connections it opened. */
function fixtureHost(command = python, args = [fixture]) {
  let current;
  const opened = { count: 0 };
  const host = new NativeHost({
    connect: () => {
      opened.count += 1;
      current = nodePort(command, args);
      return current;
    },
    lastError: () => current?.lastError(),
  });
  return { host, opened };
}

test("a request gets its own reply from the real host", { skip }, async () => {
  const { host } = fixtureHost();
  const status = await host.request("status");
  assert.equal(status.host_version, "test");
  host.disconnect();
});

test("a result sent in parts comes back whole", { skip }, async () => {
  const { host } = fixtureHost();
  const result = await host.request("big");
  assert.equal(result.rows.length, 12000);
  assert.equal(result.rows[11999].n, 11999);
  assert.ok(result.rows[5].text.startsWith('passage 5 · é ✓ "q" '));
  host.disconnect();
});

test("events reach the caller in order, parted events joined, before the reply", { skip }, async () => {
  const { host } = fixtureHost();
  const seen = [];
  const result = await host.request("events", {}, { onEvent: (name, data) => seen.push([name, data]) });
  assert.deepEqual(result, { done: true });
  assert.deepEqual(seen.slice(0, 3).map(([, d]) => d.done), [1, 2, 3]);
  assert.equal(seen[3][0], "token");
  assert.equal(seen[3][1].text.length, 1_500_000);
  host.disconnect();
});

test("an error reply becomes a HostError with the host's code and detail", { skip }, async () => {
  const { host } = fixtureHost();
  await assert.rejects(host.request("fail"), (err) => {
    assert.ok(err instanceof HostError);
    assert.equal(err.code, "kb_not_found");
    assert.deepEqual(err.detail, { kb: "nope" });
    return true;
  });
  await assert.rejects(host.request("no.such.type"), (err) => err.code === "unknown_type");
  host.disconnect();
});

test("aborting a request cancels it in the host, and other requests still answer", { skip }, async () => {
  const { host } = fixtureHost();
  const controller = new AbortController();
  const waiting = host.request("wait", {}, { signal: controller.signal });
  const status = await host.request("status"); // answered while "wait" runs
  assert.equal(status.host_version, "test");
  controller.abort();
  await assert.rejects(waiting, (err) => err.code === "cancelled");
  host.disconnect();
});

test("when the host exits mid-request the request fails, and the next request reconnects", { skip }, async () => {
  const { host, opened } = fixtureHost();
  await assert.rejects(host.request("die"), (err) => err.code === "host_exited");
  assert.equal(host.connected, false);
  const status = await host.request("status");
  assert.equal(status.host_version, "test");
  assert.equal(opened.count, 2);
  host.disconnect();
});

test("a host that cannot be started is reported as missing", async () => {
  const { host } = fixtureHost(join(home, "no-such-host-binary"), []);
  await assert.rejects(host.request("status"), (err) => err.code === "host_missing" && /localkb install/.test(err.message));
});

test("Chrome's and Firefox's disconnect messages map to stable codes", () => {
  assert.equal(disconnectCode("Specified native messaging host not found."), "host_missing");
  // Firefox words it its own way, and puts it on the port rather than in runtime.lastError.
  assert.equal(disconnectCode("No such native application com.localkb.host"), "host_missing");
  assert.equal(disconnectCode("Access to the specified native messaging host is forbidden."), "host_forbidden");
  assert.equal(disconnectCode("Native host has exited."), "host_exited");
  assert.equal(disconnectCode("Error when communicating with the native messaging host."), "host_disconnected");
  assert.equal(disconnectCode(undefined), "host_disconnected");
});
