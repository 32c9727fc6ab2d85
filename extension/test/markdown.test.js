import assert from "node:assert/strict";
import { test } from "node:test";

import { markdownHtml, safeHref } from "../markdown.js";

test("markdown becomes HTML: headings, bold, lists, code fences, tables", () => {
  const html = markdownHtml("## Steps\n\n**Cool** it:\n\n- off\n- wait\n\n```sh\nmake test\n```\n\n| a | b |\n|---|---|\n| 1 | 2 |");
  assert.match(html, /<h2>Steps<\/h2>/);
  assert.match(html, /<strong>Cool<\/strong>/);
  assert.match(html, /<li>off<\/li>/);
  assert.match(html, /<pre><code class="language-sh">make test\n<\/code><\/pre>/);
  assert.match(html, /<table>/);
});

test("raw HTML from a model is escaped into text, never passed through", () => {
  const html = markdownHtml('Hi <script>alert(1)</script> and <img src=x onerror="alert(2)">');
  assert.doesNotMatch(html, /<script|<img/i);
  assert.match(html, /&#60;script&#62;alert\(1\)&#60;\/script&#62;/);
});

test("images are never loaded: they become their alt text", () => {
  const html = markdownHtml("![secret](https://evil.test/x.png?q=data)");
  assert.doesNotMatch(html, /<img|evil\.test/);
  assert.match(html, /\[image: secret\]/);
});

test("links keep http(s) and mailto; javascript: and data: become plain text", () => {
  assert.match(markdownHtml("[ok](https://ex.test/a)"), /<a href="https:\/\/ex.test\/a">ok<\/a>/);
  const bad = markdownHtml("[x](javascript:alert(1)) [y](data:text/html,hi) [z](JAVASCRIPT:alert(1))");
  assert.doesNotMatch(bad, /<a/);
  assert.equal(safeHref("javascript:alert(1)"), false);
  assert.equal(safeHref(" https://ex.test "), true);
  assert.equal(safeHref("/relative"), false);
});

test("[n] becomes a citation link only for numbers the host returned", () => {
  const html = markdownHtml("It overheated [1][3], see [2, 1] and [2024].", { citations: [{ n: 1 }, { n: 2 }] });
  assert.match(html, /<a class="cite" href="#" data-n="1">\[1\]<\/a>\[3\]/);
  assert.match(html, /data-n="2">\[2\]<\/a><a class="cite" href="#" data-n="1">/);
  assert.match(html, /\[2024\]/);
});

test("citations inside code stay literal", () => {
  const html = markdownHtml("`arr[1]`", { citations: [{ n: 1 }] });
  assert.doesNotMatch(html, /class="cite"/);
});
