// The side panel: pick knowledge bases, chat with streamed answers that
// explain themselves (one step line per knowledge base), open cited passages,
// test a search, and add the open tab. It talks to the host directly through
// native.js; saves go through the service worker, which owns the badge,
// notifications and the job records the status list here shows.

import { el, hostMissingNotice, setChildren } from "./dom.js";
import { sourceLink } from "./fragments.js";
import { rememberKnowledgeBases } from "./kbs.js";
import { HostError, NativeHost } from "./native.js";
import {
  canTestSearch,
  canUseWeaker,
  endpointLocation,
  formatScore,
  isHostMissing,
  modelLine,
  passageFacts,
  privacyLabel,
  progressText,
  scoreBars,
  splitCitations,
  stepLine,
} from "./render.js";

const host = new NativeHost();

/**
 * @param {string} id
 * @returns {any} the element (typed loosely: each caller knows what it asked for)
 */
const $ = (id) => document.getElementById(id);

/**
 * @typedef {object} Turn  one question and its answer, as kept in storage.session
 * @property {string} message
 * @property {string[]} kbs
 * @property {string} [answer]
 * @property {any[]} [citations]
 * @property {any[]} [statuses]
 * @property {{name: string, location: string} | null} [model]
 * @property {boolean} [generated]
 * @property {string} [rewritten_query]
 * @property {boolean} [usedWeaker]
 * @property {{code: string, message: string}} [error]
 */

const state = {
  /** @type {any} */ status: null,
  /** @type {any[]} */ kbs: [],
  /** @type {Set<string>} */ selected: new Set(),
  /** @type {any[]} */ endpoints: [],
  /** @type {string | null} */ endpoint: null,
  /** @type {Turn[]} */ turns: [],
  /** @type {AbortController | null} */ asking: null,
};

// ---- start-up and the host connection ----

async function connect() {
  setChildren($("host-missing-slot"));
  try {
    state.status = await host.request("status");
  } catch (err) {
    showHostProblem(err);
    return;
  }
  $("app").hidden = false;
  setReady(false);
  await Promise.all([loadKnowledgeBases(), loadEndpoints()]);
  renderModel();
  await restoreChat();
  await renderJobs();
  setReady(true);
}

/**
 * Asking waits until the knowledge bases and the saved chat are loaded: a question typed
 * earlier would find no knowledge base selected, and the restored chat would replace it.
 * @param {boolean} ready
 */
function setReady(ready) {
  /** @type {HTMLTextAreaElement} */ ($("question")).disabled = !ready;
  for (const button of $("ask").querySelectorAll("button")) /** @type {HTMLButtonElement} */ (button).disabled = !ready;
  document.body.dataset.ready = String(ready);
}

/** @param {unknown} err */
function showHostProblem(err) {
  const error = /** @type {HostError} */ (err);
  $("app").hidden = true;
  $("model-name").textContent = "Not connected";
  $("model-where").hidden = true;
  setChildren(
    $("host-missing-slot"),
    hostMissingNotice({
      code: error?.code,
      message: isHostMissing(error) ? undefined : error?.message,
      onRetry: () => connect(),
    }),
  );
}

async function loadKnowledgeBases() {
  const { knowledge_bases: kbs } = await host.request("kb.list");
  state.kbs = kbs;
  const stored = await chrome.storage.local.get("selectedKbs");
  const known = new Set(kbs.map((/** @type {any} */ kb) => kb.id));
  const wanted = (stored.selectedKbs ?? []).filter((/** @type {string} */ id) => known.has(id));
  state.selected = new Set(wanted.length ? wanted : kbs.map((/** @type {any} */ kb) => kb.id));
  // Keep the worker's menus in step with what the host has now.
  renderKnowledgeBases(await rememberKnowledgeBases(kbs));
}

async function loadEndpoints() {
  try {
    const config = await host.request("config.get");
    state.endpoints = config.endpoints ?? [];
    const { endpoint } = await chrome.storage.local.get("endpoint");
    const names = state.endpoints.map((e) => e.name);
    state.endpoint = names.includes(endpoint) ? endpoint : (config.default_endpoint ?? names[0] ?? null);
  } catch {
    // Older hosts or a broken config: the status line still names the default model.
    state.endpoints = [];
    state.endpoint = null;
  }
  const select = /** @type {HTMLSelectElement} */ ($("endpoint"));
  setChildren(
    select,
    ...state.endpoints.map((e) =>
      el("option", { value: e.name, selected: e.name === state.endpoint, text: `${e.name} (${endpointLocation(e) === "device" ? "on device" : "cloud"})` }),
    ),
  );
  $("endpoint-wrap").hidden = state.endpoints.length < 2;
}

/** The model that will answer, as {name, location}, or null for extractive answers. */
function currentModel() {
  const chosen = state.endpoints.find((e) => e.name === state.endpoint);
  if (chosen) return { name: chosen.model ? `${chosen.name} · ${chosen.model}` : chosen.name, short: chosen.name, location: endpointLocation(chosen) };
  const ep = state.status?.endpoint;
  return ep ? { name: ep.name, short: ep.name, location: ep.location } : null;
}

function renderModel() {
  const model = currentModel();
  const name = $("model-name");
  const where = $("model-where");
  if (!model) {
    // The whole sentence does not fit the header of a narrow panel; it stays as the tooltip.
    name.textContent = "No language model";
    name.title = modelLine(null);
    where.hidden = false;
    where.textContent = "quotes passages";
    where.className = "pill muted";
  } else {
    name.textContent = model.name;
    name.title = modelLine({ name: model.name, location: /** @type {any} */ (model.location) });
    where.hidden = false;
    where.textContent = model.location === "device" ? "on device" : "cloud";
    where.className = `pill ${model.location === "device" ? "device" : "cloud"}`;
  }
  const embed = state.status?.model;
  if (embed && (embed.error || embed.loaded === false)) {
    name.title = `${name.title}\nEmbedding model: ${embed.error || "not loaded yet"}`;
  }
  renderKnowledgeBases();
}

/** @param {string | null} [defaultKb] */
function renderKnowledgeBases(defaultKb) {
  const list = $("kb-list");
  const model = currentModel();
  const cloud = model?.location === "cloud";
  const items = state.kbs.map((kb) => {
    const id = `kb-${kb.id}`;
    const blocked = cloud && kb.privacy !== "cloud";
    return el(
      "label",
      { class: "kb-option", for: id },
      el("input", {
        type: "checkbox",
        id,
        value: kb.id,
        checked: state.selected.has(kb.id),
        onchange: (/** @type {Event} */ e) => {
          const box = /** @type {HTMLInputElement} */ (e.target);
          if (box.checked) state.selected.add(kb.id);
          else state.selected.delete(kb.id);
          chrome.storage.local.set({ selectedKbs: [...state.selected] });
        },
      }),
      el("span", { class: "name", text: kb.name, title: `${kb.sources} sources · ${kb.chunks} passages · ${kb.model}` }),
      el("span", { class: "count muted", text: `${kb.sources ?? 0} src` }),
      el("span", {
        class: `pill ${blocked ? "warn" : kb.privacy === "cloud" ? "cloud" : "device"}`,
        text: privacyLabel(kb.privacy),
        title: blocked
          ? `Device only: ${model?.short ?? "this model"} is a cloud model, so this knowledge base will be skipped`
          : kb.privacy === "cloud"
            ? "May be sent to a cloud model"
            : "Never leaves this device",
      }),
    );
  });
  setChildren(list, el("legend", { class: "visually-hidden", text: "Knowledge bases to search" }), ...items);
  $("kb-empty").hidden = state.kbs.length > 0;

  const addTo = /** @type {HTMLSelectElement} */ ($("add-to"));
  const current = addTo.value || defaultKb;
  setChildren(
    addTo,
    ...(state.kbs.length
      ? state.kbs.map((kb) => el("option", { value: kb.id, text: kb.name, selected: kb.id === current }))
      : [el("option", { value: "", text: "a new knowledge base" })]),
  );
}

// ---- saving the open tab ----

async function addThisTab() {
  const button = /** @type {HTMLButtonElement} */ ($("add-tab"));
  button.disabled = true;
  try {
    const win = await chrome.windows.getCurrent();
    const kb = /** @type {HTMLSelectElement} */ ($("add-to")).value || undefined;
    const job = await chrome.runtime.sendMessage({ type: "save-active-tab", windowId: win.id, kb });
    if (job?.error?.code === "no_access") $("grant-access").hidden = false;
    else if (job?.error && !job.id) flashNotice(job.error.message); // a failed job shows in the list
  } finally {
    button.disabled = false;
  }
}

async function grantAccess() {
  // Must run straight from the click: Chrome only shows the prompt during a user gesture.
  const granted = await chrome.permissions.request({ origins: ["<all_urls>"] }).catch(() => false);
  if (granted) {
    $("grant-access").hidden = true;
    await addThisTab();
  }
}

async function renderJobs() {
  const all = await chrome.storage.session.get(null);
  const jobs = Object.entries(all)
    .filter(([key]) => key.startsWith("job:"))
    .map(([, job]) => job)
    .sort((a, b) => (b.startedAt ?? 0) - (a.startedAt ?? 0))
    .slice(0, 4);
  const needsAccess = jobs.some((j) => j.state === "failed" && j.error?.code === "no_access");
  if (needsAccess) $("grant-access").hidden = false;
  setChildren(
    $("jobs"),
    ...jobs.map((job) => {
      const running = job.state === "capturing" || job.state === "saving";
      let kind = job.state;
      if (job.state === "done") kind = job.report?.failed ? "partial" : job.text === "unchanged" ? "unchanged" : "done";
      return el(
        "li",
        { class: `job ${kind}`, dataset: { job: job.id, state: job.state } },
        el("span", { class: "title", text: job.title, title: job.url ?? job.title }),
        running
          ? el("button", {
              type: "button",
              class: "small",
              text: "Cancel",
              "aria-label": `Cancel saving ${job.title}`,
              onclick: () => chrome.runtime.sendMessage({ type: "cancel-job", jobId: job.id }),
            })
          : el("button", {
              type: "button",
              class: "small link",
              text: "Dismiss",
              "aria-label": `Dismiss ${job.title}`,
              onclick: () => chrome.storage.session.remove(`job:${job.id}`),
            }),
        el("span", {
          class: "line",
          role: "status",
          text: running ? progressText(job) : `${job.kbName ? `${job.kbName}: ` : ""}${job.text ?? ""}`,
        }),
        running && job.total ? el("progress", { max: job.total, value: job.done ?? 0, "aria-label": "Save progress" }) : null,
      );
    }),
  );
}

chrome.storage.onChanged.addListener((changes, area) => {
  if (area !== "session") return;
  const jobChanges = Object.entries(changes).filter(([key]) => key.startsWith("job:"));
  if (!jobChanges.length) return;
  renderJobs();
  const finished = jobChanges.some(([, c]) => c.newValue?.state === "done" && c.oldValue?.state !== "done");
  if (finished && !$("app").hidden) loadKnowledgeBases().catch(() => {});
});

// ---- the conversation ----

async function restoreChat() {
  const { chat } = await chrome.storage.session.get("chat");
  state.turns = Array.isArray(chat) ? chat : [];
  const box = $("conversation");
  setChildren(box, ...(state.turns.length ? [] : [emptyChat()]));
  for (const turn of state.turns) {
    box.append(renderUser(turn.message));
    const block = assistantBlock();
    box.append(block.root);
    renderFinal(block, turn, state.turns.indexOf(turn));
  }
  box.scrollTop = box.scrollHeight;
}

function emptyChat() {
  return el(
    "div",
    { class: "empty-chat", id: "empty-chat" },
    el("p", { text: "Ask a question about what you saved. Every answer says which knowledge bases it searched and cites its passages." }),
  );
}

function saveChat() {
  return chrome.storage.session.set({ chat: state.turns });
}

/** @param {string} message */
function renderUser(message) {
  return el("div", { class: "turn-user", text: message });
}

function assistantBlock() {
  const steps = el("ul", { class: "steps", "aria-label": "What was searched" });
  const answer = el("div", { class: "answer" });
  const sources = el("div", { class: "sources" });
  const meta = el("div", { class: "answer-meta" });
  const root = el("article", { class: "turn-assistant", "aria-label": "Answer" }, steps, answer, sources, meta);
  return { root, steps, answer, sources, meta };
}

/**
 * History for the host: earlier completed turns as user/assistant messages.
 * @param {number} upTo index of the turn being asked
 */
function historyBefore(upTo) {
  const history = [];
  for (const turn of state.turns.slice(0, upTo)) {
    if (turn.error || turn.answer === undefined) continue;
    history.push({ role: "user", content: turn.message }, { role: "assistant", content: turn.answer });
  }
  return history;
}

/**
 * Ask (or re-ask) a question, streaming the answer into the conversation.
 * @param {string} message
 * @param {{useWeaker?: boolean, replace?: number}} [options] replace: index of the turn to answer again
 */
async function ask(message, options = {}) {
  if (state.asking) return;
  const kbs = [...state.selected];
  if (!kbs.length) {
    flashNotice("Pick at least one knowledge base to ask.");
    return;
  }
  $("empty-chat")?.remove();
  const box = $("conversation");
  const index = options.replace ?? state.turns.length;
  const history = historyBefore(index);
  /** @type {Turn} */
  const turn = { message, kbs, usedWeaker: Boolean(options.useWeaker) };
  const block = assistantBlock();
  if (options.replace === undefined) {
    box.append(renderUser(message), block.root);
    state.turns.push(turn);
  } else {
    const old = box.querySelectorAll(".turn-assistant")[index];
    old?.replaceWith(block.root);
    state.turns[index] = turn;
  }
  block.answer.classList.add("streaming");
  block.answer.setAttribute("aria-busy", "true");
  box.scrollTop = box.scrollHeight;

  const controller = new AbortController();
  state.asking = controller;
  setAsking(true);
  const stepsByKb = new Map();
  let streamed = "";
  /** @type {Record<string, any>} */
  const data = { kbs, message, history, use_weaker_matches: Boolean(options.useWeaker) };
  if (state.endpoint) data.endpoint = state.endpoint;
  try {
    const result = await host.request("chat", data, {
      signal: controller.signal,
      onEvent: (event, payload) => {
        if (event === "step") {
          const li = stepItem(payload, turn, index, true);
          const old = stepsByKb.get(payload.kb);
          if (old) old.replaceWith(li);
          else block.steps.append(li);
          stepsByKb.set(payload.kb, li);
        } else if (event === "token") {
          streamed += payload?.text ?? "";
          block.answer.textContent = streamed;
          box.scrollTop = box.scrollHeight;
        } else if (event === "confirm") {
          block.root.insertBefore(el("p", { class: "notice", text: payload?.message ?? JSON.stringify(payload) }), block.answer);
        }
      },
    });
    Object.assign(turn, {
      answer: result.answer ?? streamed,
      citations: result.citations ?? [],
      statuses: result.statuses ?? [],
      model: result.model ?? null,
      generated: Boolean(result.generated),
      rewritten_query: result.rewritten_query,
    });
  } catch (err) {
    const e = /** @type {HostError} */ (err);
    turn.error = { code: e.code ?? "error", message: e.message };
    if (streamed) turn.answer = streamed;
    if (isHostMissing(e)) showHostProblem(e);
  } finally {
    state.asking = null;
    setAsking(false);
  }
  renderFinal(block, turn, index);
  await saveChat();
  box.scrollTop = box.scrollHeight;
}

/**
 * Render a finished (or failed) answer: step lines with their actions, the
 * answer with citation links, the cited sources, and how it was answered.
 * @param {ReturnType<typeof assistantBlock>} block
 * @param {Turn} turn
 * @param {number} index
 */
function renderFinal(block, turn, index) {
  block.answer.classList.remove("streaming");
  block.answer.removeAttribute("aria-busy");
  if (turn.statuses?.length) {
    setChildren(block.steps, ...turn.statuses.map((s) => stepItem(s, turn, index, false)));
  }
  if (turn.error) {
    if (turn.answer) block.answer.textContent = turn.answer;
    else block.answer.remove();
    const text = turn.error.code === "cancelled" ? "Stopped." : turn.error.message;
    block.meta.replaceWith(el("p", { class: "answer-error", role: "alert", text }));
    return;
  }
  const pieces = splitCitations(turn.answer ?? "", turn.citations ?? []);
  setChildren(
    block.answer,
    ...pieces.map((p) =>
      p.type === "text"
        ? p.text
        : el("a", {
            href: "#",
            class: "cite",
            text: p.label,
            dataset: { n: String(p.n) },
            "aria-label": `Citation ${p.n}: ${p.citation.title ?? "passage"}`,
            onclick: (/** @type {Event} */ e) => {
              e.preventDefault();
              openPassage(p.citation);
            },
          }),
    ),
  );
  setChildren(
    block.sources,
    ...(turn.citations ?? []).map((c) =>
      el("button", {
        type: "button",
        class: "small",
        text: `[${c.n}] ${c.title || c.url || "passage"}`,
        title: `${c.kb_name ?? ""} · ${c.title ?? ""}`,
        onclick: () => openPassage(c),
      }),
    ),
  );
  const meta = [];
  if (turn.generated && turn.model) {
    meta.push(`Answered by ${turn.model.name} · ${turn.model.location === "device" ? "on this device" : "cloud"}`);
  } else {
    meta.push("Quoted from your passages (no language model)");
  }
  if (turn.rewritten_query && turn.rewritten_query.trim() !== turn.message.trim()) {
    meta.push(`Searched for “${turn.rewritten_query}”`);
  }
  if (turn.usedWeaker) meta.push("Weaker matches used");
  setChildren(block.meta, ...meta.map((m) => el("span", { text: m })));
}

/**
 * One step line with its actions.
 * @param {any} status
 * @param {Turn} turn
 * @param {number} index
 * @param {boolean} live while the answer streams the actions wait
 */
function stepItem(status, turn, index, live) {
  const model = currentModel();
  const text = stepLine(status, { model: turn.model?.name ?? model?.short ?? null });
  const actions = el("span", { class: "actions" });
  if (!live && canUseWeaker(status) && !turn.usedWeaker) {
    actions.append(
      el("button", {
        type: "button",
        class: "link",
        text: "Use weaker matches for this reply",
        onclick: () => ask(turn.message, { useWeaker: true, replace: index }),
      }),
    );
  }
  if (!live && canTestSearch(status)) {
    actions.append(
      el("button", {
        type: "button",
        class: "link",
        text: "Test this search",
        onclick: () => testSearch(status, turn.rewritten_query || turn.message),
      }),
    );
  }
  return el(
    "li",
    { class: "step", dataset: { status: status.status, kb: status.kb ?? "" } },
    el("span", { class: "text", text }),
    actions.childElementCount ? actions : null,
  );
}

/** @param {boolean} asking */
function setAsking(asking) {
  /** @type {HTMLButtonElement} */ ($("send")).disabled = asking;
  $("stop").hidden = !asking;
}

/** @param {string} text */
function flashNotice(text) {
  const notice = el("p", { class: "notice", role: "alert", text });
  $("conversation").append(notice);
  setTimeout(() => notice.remove(), 4000);
}

// ---- passage card and search test ----

/** @param {any} citation */
function openPassage(citation) {
  $("passage-title").textContent = `Passage [${citation.n}]`;
  setChildren(
    $("passage-facts"),
    ...passageFacts(citation).flatMap((f) => [el("dt", { text: f.label }), el("dd", { text: f.value })]),
  );
  $("passage-text").textContent = citation.text ?? "";
  const link = /** @type {HTMLAnchorElement} */ ($("passage-link"));
  const href = sourceLink(citation);
  link.hidden = href === null;
  if (href) link.href = href;
  /** @type {HTMLDialogElement} */ ($("passage-card")).showModal();
}

/**
 * "Test this search": run the search for one knowledge base with weaker
 * matches included and draw every hit's score against the cut-off.
 * @param {any} status
 * @param {string} query
 */
async function testSearch(status, query) {
  const dialog = /** @type {HTMLDialogElement} */ ($("search-test"));
  $("search-test-title").textContent = `Test this search · ${status.kb_name ?? status.kb}`;
  $("search-test-query").textContent = `“${query}”`;
  $("search-test-status").textContent = "Searching…";
  setChildren($("search-test-chart"));
  if (!dialog.open) dialog.showModal();
  let result;
  try {
    result = await host.request("search", { kbs: [status.kb], query, include_weaker: true, k: 10 });
  } catch (err) {
    $("search-test-status").textContent = /** @type {Error} */ (err).message;
    return;
  }
  const kbStatus = (result.statuses ?? []).find((/** @type {any} */ s) => s.kb === status.kb) ?? status;
  const cutoff = kbStatus.cutoff ?? result.cutoff ?? status.cutoff ?? null;
  const hits = (result.hits ?? []).filter((/** @type {any} */ h) => h.kb === status.kb || !h.kb);
  $("search-test-status").textContent = `${stepLine(kbStatus)} · cut-off ${formatScore(cutoff)}`;
  const chart = $("search-test-chart");
  if (!hits.length) {
    setChildren(chart, el("p", { class: "muted", text: "No passage came back at all." }));
    return;
  }
  const layout = scoreBars(hits, cutoff);
  const rows = layout.rows.map((row) =>
    el(
      "div",
      { class: "bar-row", dataset: { above: String(row.above) } },
      el(
        "div",
        { class: "bar-label" },
        el("span", { class: "name", text: row.label, title: row.hit.text ?? "" }),
        el("span", {
          class: "score",
          text: `cos ${formatScore(row.value)}${typeof row.hit.bm25 === "number" ? ` · bm25 ${row.hit.bm25.toFixed(1)}` : ""}`,
        }),
      ),
      el(
        "div",
        { class: "bar-track" },
        el("div", { class: `bar-fill ${row.above ? "above" : "below"}`, style: { width: `${row.pct}%` } }),
      ),
    ),
  );
  const area = el("div", { class: "bar-area" }, ...rows);
  if (layout.cutoffPct !== null) {
    area.append(
      el(
        "div",
        { class: "cutoff-line", style: { left: `${layout.cutoffPct}%` }, "aria-hidden": "true", dataset: { cutoff: String(cutoff) } },
        el("span", { class: "cutoff-label", text: `cut-off ${formatScore(cutoff)}` }),
      ),
    );
  }
  chart.setAttribute(
    "aria-label",
    `${hits.length} passages; ${layout.rows.filter((r) => r.above).length} above the cut-off of ${formatScore(cutoff)}`,
  );
  setChildren(
    chart,
    el("div", { class: "spacer", style: { height: "1rem" } }),
    area,
    el("div", { class: "axis" }, el("span", { text: formatScore(layout.min) }), el("span", { text: formatScore(layout.max) })),
  );
}

// ---- wiring ----

document.addEventListener("click", (e) => {
  const target = /** @type {HTMLElement} */ (e.target);
  if (target.matches("[data-close]")) /** @type {HTMLDialogElement} */ (target.closest("dialog"))?.close();
});
for (const dialog of document.querySelectorAll("dialog")) {
  // A click on the backdrop (the dialog element itself, outside its content) closes it.
  dialog.addEventListener("click", (e) => {
    if (e.target === dialog) /** @type {HTMLDialogElement} */ (dialog).close();
  });
}
$("ask").addEventListener("submit", (e) => {
  e.preventDefault();
  const box = /** @type {HTMLTextAreaElement} */ ($("question"));
  const message = box.value.trim();
  if (!message) return;
  box.value = "";
  ask(message);
});
$("question").addEventListener("keydown", (e) => {
  const ev = /** @type {KeyboardEvent} */ (e);
  if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) {
    ev.preventDefault();
    /** @type {HTMLFormElement} */ ($("ask")).requestSubmit();
  }
});
$("stop").addEventListener("click", () => state.asking?.abort());
$("new-chat").addEventListener("click", async () => {
  state.turns = [];
  await saveChat();
  setChildren($("conversation"), emptyChat());
});
$("add-tab").addEventListener("click", () => addThisTab());
$("grant-access").addEventListener("click", () => grantAccess());
$("endpoint").addEventListener("change", (e) => {
  state.endpoint = /** @type {HTMLSelectElement} */ (e.target).value;
  chrome.storage.local.set({ endpoint: state.endpoint });
  renderModel();
});

connect();
