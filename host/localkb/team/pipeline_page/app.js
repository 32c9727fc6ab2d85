// The team server's pipeline view: chat on the left; on the right the caller's access, each
// stage of the last turn with its latency, the rerank table and the cache badges. Text from
// the server is only ever set as textContent (never parsed as HTML).
import { el } from "./dom.js";
import { readSSE } from "./sse.js";

const $ = (sel) => document.querySelector(sel);
const state = { token: sessionStorage.getItem("localkb-team-token") || "", kbs: [], history: [] };
/** The order stages are listed in, live or from the result. */
const STAGE_ORDER = ["guard_in", "limits", "access", "cache", "rewrite", "embed", "vector", "keyword", "fuse", "rerank", "generate", "guard_out", "log"];

async function api(path, options = {}) {
  const resp = await fetch(path, {
    ...options,
    headers: { Authorization: `Bearer ${state.token}`, "Content-Type": "application/json", ...(options.headers || {}) },
  });
  if (resp.headers.get("content-type")?.startsWith("text/event-stream")) return resp;
  const body = await resp.json();
  if (!body.ok) throw Object.assign(new Error(body.error.message), { code: body.error.code, detail: body.error.detail });
  return body.result;
}

async function loadHealth() {
  try {
    const h = await (await fetch("/v1/health")).json();
    $("#team-name").textContent = h.result ? `· ${h.result.name}` : "";
  } catch { /* the page still works without it */ }
}

async function useToken(token) {
  state.token = token.trim();
  sessionStorage.setItem("localkb-team-token", state.token);
  $("#who").textContent = "…";
  try {
    const [me, list] = await Promise.all([api("/v1/me"), api("/v1/kbs")]);
    state.kbs = list.knowledge_bases;
    $("#who").textContent = `Signed in as ${me.user}${me.admin ? " (admin)" : ""}`;
    renderAccess(me);
    renderKbs();
    $("#send").disabled = state.kbs.length === 0;
  } catch (err) {
    $("#who").textContent = `Not signed in: ${err.message}`;
    $("#send").disabled = true;
  }
}

function renderAccess(me) {
  const body = $("#access tbody");
  body.replaceChildren();
  const names = Object.fromEntries(state.kbs.map((k) => [k.id, k.name]));
  if (me.knowledge_bases === null || me.admin) {
    body.append(el("tr", {}, el("td", { text: "every knowledge base" }), el("td", { text: "secret (admin)" }), el("td", { text: "yes" })));
  }
  for (const [id, grant] of Object.entries(me.knowledge_bases || {})) {
    body.append(el("tr", {}, el("td", { text: names[id] || id }), el("td", { text: grant.level }), el("td", { text: grant.write ? "yes" : "no" })));
  }
  const grants = Object.entries(me.knowledge_bases || {});
  $("#access-line").textContent = me.admin ? "· administrator" : `· ${grants.length} knowledge base${grants.length === 1 ? "" : "s"}`;
}

function renderKbs() {
  const box = $("#kbs");
  box.replaceChildren(el("legend", { text: "Knowledge bases" }));
  if (!state.kbs.length) box.append(el("p", { class: "muted", text: "No knowledge base is granted to you." }));
  for (const kb of state.kbs) {
    const input = el("input", { type: "checkbox", value: kb.id, checked: true, name: "kb" });
    box.append(el("label", {}, input, `${kb.name} · ${kb.privacy} · up to ${kb.access.level}`));
  }
}

function badge(text, kind, title) {
  return el("span", { class: `badge ${kind}`, text, title });
}

/** One stage's row, added or updated as the turn goes (bars rescaled to the slowest so far). */
function showStage(stage, ms) {
  const body = $("#stages tbody");
  let row = body.querySelector(`tr[data-stage="${stage}"]`);
  if (!row) {
    row = el("tr", { "data-stage": stage }, el("td", { text: stage }), el("td", { class: "num" }), el("td", { class: "bar" }, el("span")));
    const after = [...body.children].find((r) => STAGE_ORDER.indexOf(r.dataset.stage) > STAGE_ORDER.indexOf(stage));
    body.insertBefore(row, after ?? null);
  }
  row.dataset.ms = String(ms);
  row.querySelector("td.num").textContent = Number(ms).toFixed(1);
  const rows = [...body.children];
  const max = Math.max(1, ...rows.map((r) => Number(r.dataset.ms)));
  for (const r of rows) r.querySelector("td.bar span").style.width = `${Math.max(0.5, (100 * Number(r.dataset.ms)) / max)}%`;
}

function renderPipeline(result) {
  const p = result.pipeline;
  const badges = $("#badges");
  badges.replaceChildren();
  const tier = p.cache.tier;
  badges.append(badge(tier === "exact" ? "cache: exact hit" : tier === "semantic" ? `cache: semantic hit ${p.cache.cosine}` : "cache: miss",
    tier ? "hit" : "miss", p.cache.semantic_threshold === null ? "semantic tier off" : `semantic threshold ${p.cache.semantic_threshold}`));
  badges.append(badge(`model: ${p.location}`, p.location === "device" ? "hit" : "warn"));
  badges.append(badge(`guard: ${p.guard.citations} citation${p.guard.citations === 1 ? "" : "s"} checked`, "hit"));
  const left = p.limits.remaining.user;
  if (left !== null && left !== undefined) badges.append(badge(`${left} requests left today`, left < 5 ? "warn" : "miss"));
  for (const st of p.stages) showStage(st.stage, st.ms);
  $("#total").textContent = `Total ${p.total_ms.toFixed(0)} ms · query log #${p.log_id}`;
  const r = p.rerank;
  const table = $("#rerank");
  const rows = $("#rerank tbody");
  rows.replaceChildren();
  if (!r.configured) {
    $("#rerank-note").textContent = "No cross-encoder is configured on this server (--rerank-model): fused order kept.";
    table.hidden = true;
  } else if (!r.order.length) {
    $("#rerank-note").textContent = tier ? "Answered from the cache: nothing was reranked." : "Nothing to rerank.";
    table.hidden = true;
  } else {
    const ms = p.stages.find((s) => s.stage === "rerank")?.ms ?? 0;
    $("#rerank-note").textContent = `${r.model}: ${r.scored} pairs scored (top ${r.top}) in ${ms.toFixed(1)} ms`;
    table.hidden = false;
    for (const row of r.order.slice(0, 10)) {
      const moved = row.before - row.after;
      rows.append(el("tr", {}, el("td", { class: "num", text: String(row.before) }),
        el("td", { class: `num ${moved > 0 ? "up" : moved < 0 ? "down" : ""}`, text: `${row.after}${moved > 0 ? ` ▲${moved}` : moved < 0 ? ` ▼${-moved}` : ""}` }),
        el("td", { text: row.title }), el("td", { class: "num", text: row.score.toFixed(2) })));
    }
  }
}

async function ask(message) {
  const kbs = [...document.querySelectorAll("#kbs input:checked")].map((i) => i.value);
  const turns = $("#turns");
  turns.append(el("li", { class: "user", text: message }));
  const answer = el("div", { class: "answer" });
  const steps = el("ul", { class: "steps" });
  const item = el("li", { class: "assistant" }, answer, steps);
  turns.append(item);
  $("#send").disabled = true;
  // This turn's stages fill in as they finish; the earlier turns go with it, so a follow-up
  // ("and what about it?") can be rewritten with what it refers to.
  $("#stages tbody").replaceChildren();
  $("#total").textContent = "Running…";
  const history = state.history.slice(-8);
  try {
    const resp = await api("/v1/chat", { method: "POST", body: JSON.stringify({ kbs, message, history, stream: true }), headers: { Accept: "text/event-stream" } });
    await readSSE(resp, ({ data }) => {
      const frame = JSON.parse(data);
      if (frame.event === "step") steps.append(el("li", { text: frame.data.line || frame.data.message }));
      else if (frame.event === "stage") showStage(frame.data.stage, frame.data.ms);
      else if (frame.event === "token") answer.textContent += frame.data.text;
      else if (frame.event === "result") {
        answer.textContent = frame.data.answer;
        item.append(el("p", { class: "muted", text: frame.data.answer_line }));
        if (frame.data.citations.length) {
          item.append(el("ul", { class: "cites" }, ...frame.data.citations.map((c) => el("li", {},
            /^https?:\/\//i.test(c.url ?? "")
              ? el("a", { href: c.url, target: "_blank", rel: "noopener noreferrer", text: `[${c.n}] ${c.title}` })
              : `[${c.n}] ${c.title}`,
            ` (${c.kb_name})`))));
        }
        state.history.push({ role: "user", content: message },
          { role: "assistant", content: frame.data.answer, kbs: frame.data.kbs ?? [] });
        renderPipeline(frame.data);
      } else if (frame.event === "error") {
        item.className = "error";
        answer.textContent = `${frame.data.code}: ${frame.data.message}`;
      }
    });
  } catch (err) {
    item.className = "error";
    answer.textContent = `${err.code || "error"}: ${err.message}`;
  } finally {
    $("#send").disabled = false;
    document.body.dataset.turns = String(turns.querySelectorAll("li.assistant, li.error").length);
  }
}

$("#token-form").addEventListener("submit", (e) => { e.preventDefault(); useToken($("#token").value); });
$("#ask").addEventListener("submit", (e) => {
  e.preventDefault();
  const message = $("#message").value;
  if (!message.trim()) return;
  $("#message").value = "";
  ask(message);
});
loadHealth();
if (state.token) useToken(state.token);
