import assert from "node:assert/strict";
import { test } from "node:test";

import {
  PartAssembler,
  PartError,
  base64ToBytes,
  bytesToBase64,
  isPartsResult,
  splitBytes,
} from "../parts.js";

/** Split a JSON text the way the host does: consecutive slices, numbered. */
function hostParts(text, size) {
  const chunks = [];
  for (let at = 0; at < text.length; at += size) chunks.push(text.slice(at, at + size));
  return chunks.map((data, index) => ({ index, count: chunks.length, data }));
}

test("parts arriving out of order join back into the original payload", () => {
  const payload = { hits: Array.from({ length: 50 }, (_, i) => ({ n: i, text: `passage ${i} · é ✓ "quoted"` })) };
  const parts = hostParts(JSON.stringify(payload), 97);
  const assembler = new PartAssembler();
  for (const part of [...parts].reverse()) assembler.add(part);
  assert.equal(assembler.complete, true);
  assert.deepEqual(assembler.json(parts.length), payload);
});

test("a missing part is an error naming it, never a short payload", () => {
  const parts = hostParts(JSON.stringify({ a: "x".repeat(500) }), 100);
  const assembler = new PartAssembler();
  for (const part of parts) if (part.index !== 2) assembler.add(part);
  assert.equal(assembler.complete, false);
  assert.throws(() => assembler.text(parts.length), (err) => err instanceof PartError && /1 of 6 parts missing \(2\)/.test(err.message));
});

test("parts that disagree on the count are rejected", () => {
  const assembler = new PartAssembler();
  assembler.add({ index: 0, count: 3, data: "a" });
  assert.throws(() => assembler.add({ index: 1, count: 4, data: "b" }), PartError);
});

test("the final reply's count must match the parts' count", () => {
  const assembler = new PartAssembler();
  assembler.add({ index: 0, count: 1, data: "{}" });
  assert.throws(() => assembler.json(2), /announced 2 parts/);
});

test("a repeated part with the same data is accepted, with other data rejected", () => {
  const assembler = new PartAssembler();
  assembler.add({ index: 0, count: 2, data: '{"a":' });
  assembler.add({ index: 0, count: 2, data: '{"a":' });
  assert.throws(() => assembler.add({ index: 0, count: 2, data: "{}" }), /twice with different data/);
  assembler.add({ index: 1, count: 2, data: "1}" });
  assert.deepEqual(assembler.json(), { a: 1 });
});

test("malformed parts are rejected", () => {
  const assembler = new PartAssembler();
  assert.throws(() => assembler.add({ index: 3, count: 3, data: "" }), /outside/);
  assert.throws(() => assembler.add({ index: 0, count: 0, data: "" }), /positive/);
  assert.throws(() => assembler.add({ index: 0, count: 1, data: 5 }), /no string data/);
  assert.throws(() => new PartAssembler().text(), /no part arrived/);
});

test("reassembled text that is not JSON is reported as such", () => {
  const assembler = new PartAssembler();
  assembler.add({ index: 0, count: 1, data: "{not json" });
  assert.throws(() => assembler.json(1), /not JSON/);
});

test("only a lone positive integer `parts` key marks a parted result", () => {
  assert.equal(isPartsResult({ parts: 3 }), true);
  assert.equal(isPartsResult({ parts: 0 }), false);
  assert.equal(isPartsResult({ parts: 3, other: 1 }), false);
  assert.equal(isPartsResult({ parts: "3" }), false);
  assert.equal(isPartsResult([3]), false);
  assert.equal(isPartsResult(null), false);
});

test("base64 round-trips every byte value and large buffers", () => {
  const bytes = new Uint8Array(300_000);
  for (let i = 0; i < bytes.length; i += 1) bytes[i] = (i * 7919) % 256;
  const b64 = bytesToBase64(bytes);
  assert.equal(b64, Buffer.from(bytes).toString("base64"));
  assert.deepEqual(base64ToBytes(b64), bytes);
  assert.equal(bytesToBase64(new Uint8Array(0)), "");
});

test("splitBytes covers the input exactly, in order", () => {
  const bytes = Uint8Array.from({ length: 10 }, (_, i) => i);
  const pieces = splitBytes(bytes, 4);
  assert.deepEqual(pieces.map((p) => [...p]), [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]);
  assert.equal(splitBytes(new Uint8Array(0), 4).length, 1);
  assert.throws(() => splitBytes(bytes, 0), RangeError);
});
