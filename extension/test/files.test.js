import assert from "node:assert/strict";
import { test } from "node:test";

import { PART_BYTES, inTurn, uploadFile } from "../files.js";
import { base64ToBytes } from "../parts.js";

/** A host that records what it is sent; `failAt` makes that part's request fail. */
function recordingHost(failAt = -1) {
  const sent = [];
  return {
    sent,
    async request(type, data) {
      sent.push({ type, ...data });
      if (data.action === "begin") return { upload: "up_1" };
      if (data.action === "part" && data.index === failAt) throw new Error("disk full");
      return {};
    },
  };
}

test("a file bigger than one part goes in numbered parts that join to its bytes", async () => {
  const bytes = new Uint8Array(PART_BYTES + 5).map((_, i) => i % 251);
  const host = recordingHost();
  const seen = [];
  const fields = await uploadFile(host, { key: "k", name: "big.pdf" },
    { blob: new Blob([bytes]), onPart: (done, total) => seen.push([done, total]) });
  assert.deepEqual(fields, { upload: "up_1", file_name: "big.pdf" });
  const parts = host.sent.filter((m) => m.action === "part");
  assert.deepEqual(parts.map((p) => p.index), [0, 1]);
  const joined = new Uint8Array(parts.flatMap((p) => [...base64ToBytes(p.data_base64)]));
  assert.deepEqual(joined, bytes);
  assert.deepEqual(seen, [[1, 2], [2, 2]]);
});

test("a failed part aborts the host's upload, and the error is the caller's", async () => {
  const host = recordingHost(0);
  await assert.rejects(uploadFile(host, { key: "k", name: "a.md" }, { blob: new Blob(["# A"]) }), /disk full/);
  assert.deepEqual(host.sent.map((m) => m.action), ["begin", "part", "abort"]);
});

test("a cancelled save sends no part and aborts the upload", async () => {
  const host = recordingHost();
  const controller = new AbortController();
  controller.abort();
  await assert.rejects(uploadFile(host, { key: "k", name: "a.md" }, { blob: new Blob(["# A"]), signal: controller.signal }),
    (err) => err.code === "cancelled");
  assert.deepEqual(host.sent.map((m) => m.action), ["begin", "abort"]);
});

test("file saves run one after another, a failed one not stopping the next", async () => {
  const order = [];
  let release = () => {};
  const gate = new Promise((r) => { release = r; });
  const first = inTurn(async () => { await gate; order.push("a"); throw new Error("x"); });
  const next = inTurn(async () => { order.push("b"); return 2; });
  await Promise.resolve();
  assert.deepEqual(order, []); // the second waits for the first
  release();
  await assert.rejects(first);
  assert.equal(await next, 2);
  assert.deepEqual(order, ["a", "b"]);
});
