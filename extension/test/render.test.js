import assert from "node:assert/strict";
import { test } from "node:test";

import {
  canTestSearch,
  canUseWeaker,
  compact,
  locationWords,
  isHostMissing,
  modelLine,
  passageFacts,
  privacyLabel,
  progressText,
  reportBadge,
  reportText,
  scoreBars,
  passageSnippet,
  tellApart,
  splitCitations,
  stepLine,
} from "../render.js";

test("step lines take the host's own wording when it sends one", () => {
  const line = "Docs · 2 passages · keyword only, the embedder is unavailable";
  assert.equal(stepLine({ kb_name: "Docs", status: "passages", count: 2, degraded: true, line }), line);
  assert.equal(stepLine({ kb_name: "Docs", status: "passages", count: 2, degraded: true }), line);
});

test("a weaker status counts its weaker matches, not its (zero) relevant passages", () => {
  // The host's KBStatus for "weaker": count = relevant passages (0), weaker = matches found.
  assert.equal(stepLine({ kb_name: "Private", status: "weaker", count: 0, weaker: 2 }), "Private · 2 weaker matches");
});

test("step lines read exactly as the product specifies", () => {
  const kb = { kb: "k1", kb_name: "Docs" };
  assert.equal(stepLine({ ...kb, status: "passages", count: 3 }), "Docs · 3 passages");
  assert.equal(stepLine({ ...kb, status: "weaker", count: 2 }), "Docs · 2 weaker matches");
  assert.equal(
    stepLine({ ...kb, status: "nothing", count: 0, best: 0.2812, cutoff: 0.35 }),
    "Docs · nothing relevant (best 0.28, cut-off 0.35)",
  );
  assert.equal(stepLine({ ...kb, status: "empty", count: 0 }), "Docs · empty");
  assert.equal(
    stepLine({ ...kb, status: "skipped", count: 0 }, { model: "gpt-4o" }),
    "Docs · skipped · device only, gpt-4o is a cloud model",
  );
  assert.equal(stepLine({ ...kb, status: "unavailable" }), "Docs · unavailable · the search could not run");
});

test("step lines use the singular for one", () => {
  assert.equal(stepLine({ kb_name: "Docs", status: "passages", count: 1 }), "Docs · 1 passage");
  assert.equal(stepLine({ kb_name: "Docs", status: "weaker", count: 1 }), "Docs · 1 weaker match");
});

test("the host's own explanation is used, and a full line is not doubled", () => {
  assert.equal(
    stepLine({ kb_name: "Docs", status: "skipped", message: "device only, gpt-4o is a cloud model" }),
    "Docs · skipped · device only, gpt-4o is a cloud model",
  );
  assert.equal(
    stepLine({ kb_name: "Docs", status: "unavailable", message: "Docs · unavailable · the index is rebuilding" }),
    "Docs · unavailable · the index is rebuilding",
  );
});

test("nothing relevant without a best score still names the cut-off, as the host does", () => {
  assert.equal(stepLine({ kb_name: "Docs", status: "nothing", best: null, cutoff: 0.35 }), "Docs · nothing relevant (cut-off 0.35)");
  assert.equal(stepLine({ kb_name: "Docs", status: "nothing", best: null, cutoff: null }), "Docs · nothing relevant");
});

test("actions appear only where they can change something", () => {
  assert.equal(canUseWeaker({ status: "weaker" }), true);
  assert.equal(canUseWeaker({ status: "nothing" }), false);
  assert.equal(canUseWeaker({ status: "passages" }), false);
  assert.equal(canTestSearch({ status: "passages" }), true);
  assert.equal(canTestSearch({ status: "skipped" }), false);
  assert.equal(canTestSearch({ status: "empty" }), false);
});

test("the save report states counts, never success", () => {
  assert.equal(reportText({ added: 24, updated: 3, unchanged: 0, failed: 0, total: 27 }), "24 passages added · 3 updated");
  assert.equal(reportText({ status: "unchanged", added: 0, updated: 0, unchanged: 27, failed: 0, total: 27 }), "unchanged");
  assert.equal(
    reportText({ added: 24, updated: 0, failed: 3, total: 27 }),
    "3 of 27 passages could not be saved · 24 passages added",
  );
  assert.equal(reportText({ added: 0, failed: 1, total: 1 }), "1 of 1 passage could not be saved");
  assert.equal(reportText({ added: 2, removed: 5 }), "2 passages added · 5 removed");
  assert.equal(reportText({ added: 1 }), "1 passage added");
  assert.equal(reportText({ updated: 4 }), "4 passages updated");
});

test("the badge is short and says failures first", () => {
  assert.deepEqual(reportBadge({ added: 24, updated: 3 }), { text: "+27", color: "#1e6b3a" });
  assert.equal(reportBadge({ added: 24, failed: 3 }).text, "!3");
  assert.equal(reportBadge({ unchanged: 9 }).text, "=");
  assert.equal(compact(1234), "1k");
  assert.equal(compact(25_999), "25k");
  assert.equal(reportBadge({ added: 25_999 }).text, "+25k");
  assert.equal(reportBadge({ added: 123_456 }).text, "≥99k");
  for (const n of [1, 999, 1000, 99_999, 100_000, 5_000_000]) {
    assert.ok(reportBadge({ added: n }).text.length <= 4, `badge for ${n}`);
    assert.ok(reportBadge({ failed: n }).text.length <= 4, `badge for ${n} failures`);
  }
});

test("citations become links only where the host returned that citation", () => {
  const citations = [{ n: 1, title: "A" }, { n: 2, title: "B" }];
  const pieces = splitCitations("Overheats [1]. Cools [1, 2]. Unknown [7]. Arrays [x].", citations);
  assert.deepEqual(
    pieces.map((p) => (p.type === "text" ? p.text : `<${p.n}>`)),
    ["Overheats ", "<1>", ". Cools ", "<1>", "<2>", ". Unknown [7]. Arrays [x]."],
  );
  assert.equal(pieces[1].citation.title, "A");
});

test("adjacent citations and an answer with none", () => {
  const pieces = splitCitations("x[1][2]", [{ n: 1 }, { n: 2 }]);
  assert.deepEqual(pieces.map((p) => p.type), ["text", "cite", "cite"]);
  assert.deepEqual(splitCitations("plain", []), [{ type: "text", text: "plain" }]);
  assert.deepEqual(splitCitations("", []), []);
});

test("passage facts show the similarity the cut-off applies to, not the rank score", () => {
  const facts = passageFacts({ n: 1, kb_name: "Docs", title: "Manual", chunk_index: 0, score: 1, cosine: 0.534 });
  assert.deepEqual(facts.at(-1), { label: "Similarity", value: "0.53" });
  assert.equal(facts.filter((f) => f.label === "Score").length, 0);
  assert.deepEqual(passageFacts({ n: 1, chunk_index: 1, chunk_count: 3 })[2], { label: "Passage", value: "#2 of 3" });
});

test("passage facts list the knowledge base, source, passage, page and score", () => {
  const facts = passageFacts({ n: 1, kb_name: "Docs", title: "Manual", chunk_index: 4, page: 2, score: 0.812 });
  assert.deepEqual(facts, [
    { label: "Knowledge base", value: "Docs" },
    { label: "Source", value: "Manual" },
    { label: "Passage", value: "#5" },
    { label: "Page", value: "2" },
    { label: "Score", value: "0.81" },
  ]);
  assert.equal(passageFacts({ n: 1, kb: "k", url: "https://x" }).length, 2);
});

test("score bars share one scale and the cut-off line sits at its score", () => {
  const hits = [
    { title: "A", chunk_index: 0, cosine: 0.8 },
    { title: "B", chunk_index: 1, cosine: 0.35 },
    { title: "C", chunk_index: 2, cosine: 0.1 },
  ];
  const layout = scoreBars(hits, 0.35);
  assert.equal(layout.cutoffPct, 35);
  assert.deepEqual(layout.rows.map((r) => r.pct), [80, 35, 10]);
  assert.deepEqual(layout.rows.map((r) => r.above), [true, true, false]);
  assert.equal(layout.rows[0].label, "A · #1");
});

test("rows read in the order of the similarity they chart, each with its rank in the search", () => {
  // The search's own order is fused (vector and keyword): its cosines are not monotone.
  const hits = [
    { title: "kw only", cosine: null, bm25: 3 },
    { title: "B", cosine: 0.41 },
    { title: "A", cosine: 0.72 },
    { title: "C", cosine: 0.2 },
  ];
  const layout = scoreBars(hits, 0.35);
  assert.deepEqual(layout.rows.map((r) => r.hit.title), ["A", "B", "C", "kw only"]);
  assert.deepEqual(layout.rows.map((r) => r.rank), [3, 2, 4, 1]);
});

test("a passage's snippet reads as the page does, not as its Markdown", () => {
  const text = "Pool settings\n## Retries\nSet `retry_limit` to **three**; see [the guide](https://x.test/g).\n| a | b |";
  assert.equal(passageSnippet(text, "Pool settings"), "Retries · Set retry_limit to three; see the guide. a b");
});

test("negative cosines extend the scale below zero", () => {
  const layout = scoreBars([{ cosine: -0.25 }, { cosine: 0.75 }], 0.25);
  assert.equal(layout.min, -0.25);
  assert.deepEqual(layout.rows.map((r) => r.pct), [80, 0]);
  assert.equal(layout.cutoffPct, 40);
});

test("without a cut-off there is no line and keyword-only hits have no bar", () => {
  const layout = scoreBars([{ cosine: null, title: "kw" }], null);
  assert.equal(layout.cutoffPct, null);
  assert.equal(layout.rows[0].pct, 0);
  assert.equal(layout.rows[0].above, false);
});

test("privacy, model and host-missing labels", () => {
  assert.equal(privacyLabel("device"), "device only");
  assert.equal(privacyLabel("cloud"), "cloud OK");
  assert.equal(modelLine({ name: "llama", location: "device" }), "llama · on device");
  assert.equal(modelLine({ name: "gpt", location: "cloud" }), "gpt · cloud");
  assert.match(modelLine(null), /No language model/);
  assert.equal(isHostMissing({ code: "host_missing" }), true);
  assert.equal(isHostMissing({ code: "kb_not_found" }), false);
});

test("where a model runs is the host's word; null reads as unknown, treated as cloud", () => {
  assert.deepEqual(locationWords("device"), { text: "on device", kind: "device" });
  assert.deepEqual(locationWords("cloud"), { text: "cloud", kind: "cloud" });
  assert.deepEqual(locationWords(null), { text: "unknown (treated as cloud)", kind: "unknown" });
  assert.deepEqual(locationWords(undefined), { text: "unknown (treated as cloud)", kind: "unknown" });
  assert.equal(modelLine({ name: "odd", location: null }), "odd · unknown (treated as cloud)");
});

test("progress lines name the stage in words", () => {
  assert.equal(progressText({ state: "capturing" }), "Reading the page…");
  // the first save after an install builds the model: said as such, not "Reading 1 of 1"
  assert.match(progressText({ state: "saving", stage: "model", done: 0, total: 1 }), /^Preparing the embedding model \(built once/);
  assert.equal(progressText({ state: "saving", stage: "embed", done: 120, total: 340 }), "Embedding 120 of 340");
  assert.equal(progressText({ state: "saving", stage: "write" }), "Writing…");
  assert.equal(
    progressText({ state: "saving", stage: "embed", done: 120, total: 340, sources_done: 1, sources_total: 5,
      current: "manual.pdf", passages: 85, eta_s: 31.6 }),
    "Embedding 120 of 340 · source 2 of 5: manual.pdf · 85 passages · about 32 s left",
  );
  assert.equal(progressText({ state: "saving", stage: "embed", done: 1, total: 2, eta_s: 600 }), "Embedding 1 of 2 · about 10 min left");
});

test("items that would show the same prefix get what tells them apart", () => {
  // Before: two chips "[1] Install guide" and "[2] Install guide" from two sites looked the same.
  const out = tellApart([
    { label: "Install guide", details: ["Docs", "a.example", "/v1/install", "passage 3"] },
    { label: "Install guide", details: ["Docs", "b.example", "/v1/install", "passage 3"] },
    { label: "Release notes", details: ["Docs", "a.example", "/notes", "passage 1"] },
  ]);
  assert.deepEqual(out, ["a.example", "b.example", ""]);
  // same page, two passages
  assert.deepEqual(
    tellApart([{ label: "FAQ", details: ["Docs", "x.example", "/faq", "passage 2"] },
      { label: "FAQ", details: ["Docs", "x.example", "/faq", "passage 7"] }]),
    ["passage 2", "passage 7"],
  );
  // long names that differ only past what fits: their differing ends
  assert.deepEqual(
    tellApart([{ label: "Engineering handbook, platform team, 2024 edition", details: [] },
      { label: "Engineering handbook, platform team, 2025 edition", details: [] }]),
    ["…2024 edition", "…2025 edition"],
  );
});
