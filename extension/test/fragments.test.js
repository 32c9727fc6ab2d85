import assert from "node:assert/strict";
import { test } from "node:test";

import { encodeTextTerm, pdfPageUrl, sourceLink, textDirective, textFragmentUrl } from "../fragments.js";

test("a short passage becomes one exact term", () => {
  assert.equal(textDirective("Error E4711 means overheating."), "text=Error%20E4711%20means%20overheating.");
});

test("dashes, commas and ampersands are escaped so they cannot end the term", () => {
  assert.equal(encodeTextTerm("state-of-the-art, fast & small"), "state%2Dof%2Dthe%2Dart%2C%20fast%20%26%20small");
  assert.equal(decodeURIComponent(encodeTextTerm("a-b,c&d")), "a-b,c&d");
});

test("a long passage becomes start and end terms from its first and last lines", () => {
  const passage = [
    "The flux capacitor needs exactly 1.21 gigawatts to work at all.",
    "Middle paragraph that the fragment does not need to spell out in full.",
    "Without that power the time circuits will stay offline for good.",
  ].join("\n");
  const directive = textDirective(passage);
  const [start, end] = directive.slice("text=".length).split(",").map(decodeURIComponent);
  // The outermost words are dropped: chunk edges may cut a word in two.
  assert.equal(start, "flux capacitor needs exactly 1.21");
  assert.equal(end, "circuits will stay offline for");
  assert.ok(passage.includes(start) && passage.includes(end));
});

test("bullets and heading marks from extraction are not part of the terms", () => {
  assert.equal(decodeURIComponent(textDirective("- ## Install it\n")), "text=Install it");
});

test("a passage without words gives no directive and leaves the URL alone", () => {
  assert.equal(textDirective(" \n - \n"), null);
  assert.equal(textFragmentUrl("https://ex.test/a", "--"), "https://ex.test/a");
});

test("the page's own fragment is kept and an old directive replaced", () => {
  assert.equal(textFragmentUrl("https://ex.test/a#intro", "hello world"), "https://ex.test/a#intro:~:text=hello%20world");
  assert.equal(textFragmentUrl("https://ex.test/a#:~:text=old", "new"), "https://ex.test/a#:~:text=new");
  assert.equal(textFragmentUrl("https://ex.test/a?q=1", "x"), "https://ex.test/a?q=1#:~:text=x");
});

test("PDF links open at the page, replacing any fragment", () => {
  assert.equal(pdfPageUrl("http://127.0.0.1:8000/doc.pdf#zoom=50", 3), "http://127.0.0.1:8000/doc.pdf#page=3");
  assert.throws(() => pdfPageUrl("http://x/doc.pdf", 0), RangeError);
});

test("sourceLink picks #page for paged passages and a text fragment otherwise", () => {
  assert.equal(sourceLink({ url: "https://ex.test/r.pdf", page: 2, text: "anything" }), "https://ex.test/r.pdf#page=2");
  assert.equal(sourceLink({ url: "https://ex.test/p", page: null, text: "hello there" }), "https://ex.test/p#:~:text=hello%20there");
  assert.equal(sourceLink({ url: "https://ex.test/p" }), "https://ex.test/p");
  assert.equal(sourceLink({ url: "/home/me/notes.md", text: "x" }), null);
  assert.equal(sourceLink({ url: "javascript:alert(1)", text: "x" }), null);
});

test("a heading that opens a passage is the prefix, never the start (tables of contents repeat headings)", () => {
  const passage = "Flux guide\n## Installing the flux unit\n\nMount the flux unit on the left rail and tighten the four bolts to twelve newton metres before connecting power.";
  const directive = textDirective(passage, { title: "Flux guide" });
  const [prefix, start, end] = directive.slice("text=".length).split(",").map(decodeURIComponent);
  assert.equal(prefix, "Installing the flux unit-");
  assert.equal(start, "Mount the flux unit on"); // the first word after a heading is whole
  assert.equal(end, "twelve newton metres before connecting");
});

test("the title line in front of every passage is left out, also when it was shortened", () => {
  const long = "A very long page title that the host cut at a word so that it fits the passage budget nicely";
  const passage = `A very long page title that the host cut at a word so that it fits the…\nError E4711 means overheating.`;
  assert.equal(textDirective(passage, { title: long }), "text=Error%20E4711%20means%20overheating.");
  assert.equal(sourceLink({ url: "https://ex.test/p", title: "T", text: "T\nhello there" }), "https://ex.test/p#:~:text=hello%20there");
});

test("markdown marks are not in the terms: a fragment is the text as the page renders it", () => {
  // Before: `` `retry_limit` `` put backticks in the term, which no page text holds, so the
  // browser found nothing and opened the page at its top.
  const passage = "Set `retry_limit` to **three** and read [the guide](https://x.test/g) first.";
  const term = decodeURIComponent(textDirective(passage).slice("text=".length));
  assert.equal(term, "Set retry_limit to three and read the guide first.");
  const long = [
    "The `max_connections` setting *limits* how many clients __may__ connect at once to the server.",
    "| Name | Default |",
    "1. Restart with `pg_ctl restart` after changing `shared_buffers` in the file.",
  ].join("\n");
  const [start, end] = textDirective(long).slice("text=".length).split(",").map(decodeURIComponent);
  assert.equal(start, "max_connections setting limits how many");
  assert.equal(end, "after changing shared_buffers in the");
  // an identifier's underscores and a lone asterisk stay: they are on the page
  assert.equal(decodeURIComponent(textDirective("Use snake_case_name * 2 here.").slice(5)),
    "Use snake_case_name * 2 here.");
});
