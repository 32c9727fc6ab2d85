import assert from "node:assert/strict";
import { test } from "node:test";

import { PRESETS, presetOf, testLine } from "../endpoints.js";

test("a preset's address is recognised, with or without a trailing slash; anything else is custom", () => {
  assert.equal(presetOf("http://127.0.0.1:11434/v1"), "ollama");
  assert.equal(presetOf(" http://127.0.0.1:1234/v1/ "), "lmstudio");
  assert.equal(presetOf("http://127.0.0.1:8080/v1"), "llamacpp");
  assert.equal(presetOf("http://127.0.0.1:8081/v1"), "custom");
  assert.equal(presetOf(""), "custom");
  assert.deepEqual(PRESETS.map((p) => p.id), ["ollama", "lmstudio", "llamacpp", "custom"]);
});

test("a test result reads as the host's verdict: count, where, or why not", () => {
  assert.equal(testLine({ ok: true, models: ["fake-model"], location: "device", error: null }),
    "answers · 1 model · on this device");
  assert.equal(testLine({ ok: true, models: ["a", "b"], location: "cloud", error: null }),
    "answers · 2 models · in the cloud");
  assert.equal(testLine({ ok: true, models: [], location: null, error: null }),
    "answers · 0 models · location unknown (treated as cloud)");
  assert.equal(testLine({ ok: false, models: [], location: "device", error: { message: "cannot connect" } }),
    "does not answer: cannot connect");
});
