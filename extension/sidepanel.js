// The side panel: a chat over the chosen knowledge bases. Answers stream in as
// rendered markdown with citation links; each answer carries one summary line
// (the host's) that unfolds into one line per knowledge base; chats are kept in
// chrome.storage.local (chats.js) and survive a restart. It talks to the host
// directly through native.js; saves go through the service worker, which owns
// the badge, notifications and the job records the save bar shows.
//
// Every sentence about models, locations, counts and statuses is the host's own
// (`line`, `summary`, `answer_line`, `message`, `location`); this page only
// arranges them.

import { ChatStore, newChat } from "./chats.js";
import { el, formatDate, hostMissingNotice, setChildren } from "./dom.js";
import { sourceLink } from "./fragments.js";
import { rememberKnowledgeBases } from "./kbs.js";
import { copyText, ready as markdownReady, renderMarkdown } from "./markdown.js";
import { HostError, NativeHost } from "./native.js";
import { initPageChat, pageRequest, resetPageChat } from "./pagechat.js";
import {
  canTestSearch,
  canUseWeaker,
  formatScore,
  isHostMissing,
  locationWords,
  modelLine,
  passageFacts,
  passageSnippet,
  privacyLabel,
  progressText,
  scoreBars,
  stepLine,
  tellApart,
} from "./render.js";

const host = new NativeHost();
const chats = new ChatStore(chrome.storage.local);
/** The select value for "answer without a model". */
const NO_MODEL = "__none__";
/** Host errors that mean the host process went away mid-session. */
const HOST_GONE = new Set(["host_exited", "host_disconnected"]);

/**
 * @param {string} id
 * @returns {any} the element (typed loosely: each caller knows what it asked for)
 */
const $ = (id) => document.getElementById(id);

/**
 * @typedef {object} Turn  one question and its answer, as kept in the chat
 * @property {string} message
 * @property {string[]} kbs the knowledge bases asked
 * @property {string | null} [endpoint] the endpoint asked, or null for "no model"
 * @property {string} [answer]
 * @property {any[]} [citations]
 * @property {any[]} [statuses]
 * @property {string} [summary] the host's summary line
 * @property {string} [answer_line] the host's "Answered by …" line
 * @property {string[]} [notes]
 * @property {{name: string, model?: string, location: string | null} | null} [model]
 * @property {boolean} [generated]
 * @property {string | null} [rewritten_query]
 * @property {string[]} [sourceKbs] the result's `kbs`: provenance, sent back in history
 * @property {string[]} [weakerKbs] knowledge bases whose weaker matches were used
 * @property {any[]} [tool_calls]
 * @property {boolean} [stopped]
 * @property {{code: string, message: string}} [error]
 * @property {{endpoint: string, code: string, message: string} | null} [model_error] the model was asked and failed
 * @property {boolean} [summarize] the open page's summary (pagechat.js), not a question
 */

const state = {
  /** @type {any} */ status: null,
  /** @type {any[]} */ kbs: [],
  /** @type {Set<string>} */ selected: new Set(),
  /** @type {any[]} */ endpoints: [],
  /** @type {string} */ endpoint: NO_MODEL,
  /** @type {import("./chats.js").Chat} */ chat: newChat(),
  /** @type {AbortController | null} */ asking: null,
  hostDown: false,
  /** The last failure of each model this panel asked (cleared by its next answer). @type {Map<string, string>} */
  modelProblems: new Map(),
  /** Whether the conversation follows new text; the reader scrolling up turns it off. */
  follow: true,
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
  setHostDown(false);
  for (const id of ["ask", "savebar", "conversation"]) $(id).hidden = false;
  setReady(false);
  await markdownReady();
  await Promise.all([loadKnowledgeBases(), loadEndpoints()]);
  renderModel();
  await restoreChat();
  await renderJobs();
  setReady(true);
  initPageChat({ host, ask, currentModel, flash: flashNotice });
  if (document.activeElement === document.body) $("question").focus();
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
  for (const id of ["ask", "savebar", "conversation"]) $(id).hidden = true;
  $("kb-popover").hidden = true;
  $("model-name").textContent = "Not connected";
  $("endpoint-wrap").hidden = true;
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

/**
 * The header says when the host went away, until a request gets through again.
 * @param {boolean} down
 */
function setHostDown(down) {
  state.hostDown = down;
  document.body.dataset.host = down ? "down" : "up";
  if (down) {
    const where = $("model-where");
    where.hidden = false;
    where.textContent = "host stopped";
    where.className = "pill bad";
    where.title = "The LocalKB host stopped. The next question (or Try again) starts it again.";
  } else if (state.status) {
    renderModel();
  }
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
  let defaultName = null;
  try {
    const config = await host.request("config.get");
    state.endpoints = config.endpoints ?? [];
    defaultName = config.default_endpoint ?? null;
  } catch {
    // A broken config: the status line still names the default model.
    state.endpoints = [];
  }
  const { endpoint } = await chrome.storage.local.get("endpoint");
  const names = state.endpoints.map((e) => e.name);
  if (endpoint === NO_MODEL || names.includes(endpoint)) state.endpoint = endpoint;
  else state.endpoint = names.includes(defaultName) ? defaultName : (names[0] ?? NO_MODEL);
  const select = /** @type {HTMLSelectElement} */ ($("endpoint"));
  setChildren(
    select,
    ...state.endpoints.map((e) =>
      el("option", { value: e.name, selected: e.name === state.endpoint, text: `${e.name} · ${locationWords(e.location).text}` }),
    ),
    el("option", { value: NO_MODEL, selected: state.endpoint === NO_MODEL, text: "No model — quote passages" }),
  );
  $("endpoint-wrap").hidden = state.endpoints.length === 0;
  document.body.dataset.endpoints = state.endpoints.length ? "some" : "none";
}

/**
 * The model that will answer, as the host describes it, or null for quoted passages.
 * @returns {{name: string, short: string, location: "device" | "cloud" | null} | null}
 */
function currentModel() {
  if (state.endpoint === NO_MODEL) return null;
  const chosen = state.endpoints.find((e) => e.name === state.endpoint);
  if (chosen) return { name: chosen.model ? `${chosen.name} · ${chosen.model}` : chosen.name, short: chosen.name, location: chosen.location ?? null };
  const ep = state.status?.endpoint;
  return ep?.name ? { name: ep.name, short: ep.name, location: ep.location ?? null } : null;
}

function renderModel() {
  const model = currentModel();
  const name = $("model-name");
  const where = $("model-where");
  // With endpoints configured the select names the model; otherwise the text does.
  name.hidden = state.endpoints.length > 0;
  if (!model) {
    name.textContent = "No model";
    name.title = modelLine(null);
    where.hidden = false;
    where.textContent = "quotes passages";
    where.className = "pill muted";
    where.title = modelLine(null);
  } else if (state.modelProblems.has(model.short)) {
    // It failed when last asked: the header says so until it answers again.
    name.textContent = model.name;
    name.title = `${model.name} did not answer: ${state.modelProblems.get(model.short)}`;
    where.hidden = false;
    where.textContent = "not answering";
    where.className = "pill bad";
    where.title = name.title;
  } else {
    const words = locationWords(model.location);
    name.textContent = model.name;
    name.title = modelLine({ name: model.name, location: model.location });
    where.hidden = false;
    where.textContent = words.text;
    where.className = `pill ${words.kind}`;
    where.title = `${model.name} runs ${words.kind === "device" ? "on this device" : words.text}, as the host decided from its address`;
  }
  const embed = state.status?.model;
  if (embed && (embed.error || embed.loaded === false)) {
    name.title = `${name.title}\nEmbedding model: ${embed.error || "not loaded yet"}`;
  }
  renderKnowledgeBases();
}

/** Whether the chosen model may not see device-only knowledge bases (cloud or unknown). */
function modelIsCloud() {
  const model = currentModel();
  return model !== null && model.location !== "device";
}

/** @param {string | null} [defaultKb] */
function renderKnowledgeBases(defaultKb) {
  const cloud = modelIsCloud();
  const model = currentModel();
  const filter = /** @type {HTMLInputElement} */ ($("kb-filter")).value.trim().toLowerCase();
  const shown = state.kbs.filter((kb) => !filter || kb.name.toLowerCase().includes(filter));
  const kbsApart = tellApart(shown.map((kb) => ({ label: kb.name, details: [kb.origin === "team" ? `team ${kb.team ?? ""}` : "this computer"] })));
  const items = shown
    .map((kb, i) => {
      const id = `kb-${kb.id}`;
      const blocked = cloud && kb.privacy !== "cloud";
      const team = kb.origin === "team";
      return el(
        "label",
        { class: "kb-option", for: id, title: `${kb.name}\n${kb.sources ?? 0} sources · ${kb.chunks ?? 0} passages · ${kb.model ?? ""}` },
        el("input", {
          type: "checkbox",
          id,
          value: kb.id,
          checked: state.selected.has(kb.id),
          onchange: (/** @type {Event} */ e) => {
            const box = /** @type {HTMLInputElement} */ (e.target);
            if (box.checked) state.selected.add(kb.id);
            else state.selected.delete(kb.id);
            saveSelection();
          },
        }),
        el("span", { class: "name", text: kb.name }),
        kbsApart[i] ? el("span", { class: "apart muted", text: kbsApart[i] }) : null,
        team ? el("span", { class: "pill muted", text: "team", title: kb.team ? `From the team server ${kb.team}` : "From a team server" }) : null,
        el("span", { class: "count muted", text: `${kb.sources ?? 0} src` }),
        el("span", {
          class: `pill ${blocked ? "warn" : kb.privacy === "cloud" ? "cloud" : "device"}`,
          text: blocked ? "device only — will be skipped" : privacyLabel(kb.privacy),
          title: blocked
            ? `Device only: ${model?.short ?? "this model"} is not on this device, so this knowledge base will be skipped`
            : kb.privacy === "cloud"
              ? "May be sent to a cloud model"
              : "Never leaves this device",
        }),
      );
    });
  setChildren($("kb-list"), el("legend", { class: "visually-hidden", text: "Knowledge bases to search" }), ...items);
  $("kb-empty").hidden = state.kbs.length > 0;
  renderKbButton();

  const addTo = /** @type {HTMLSelectElement} */ ($("add-to"));
  const current = addTo.value || defaultKb;
  setChildren(
    addTo,
    ...(state.kbs.length
      ? state.kbs.map((kb) => el("option", { value: kb.id, text: kb.name, selected: kb.id === current }))
      : [el("option", { value: "", text: "a new knowledge base" })]),
  );
}

/** The closed picker: the chosen names, and how many of them a cloud model will skip. */
function renderKbButton() {
  const chosen = state.kbs.filter((kb) => state.selected.has(kb.id));
  const names = chosen.map((kb) => kb.name);
  $("kb-chips").textContent = !state.kbs.length
    ? "no knowledge base yet"
    : !chosen.length
      ? "none chosen"
      : chosen.length <= 3
        ? names.join(", ")
        : chosen.length === state.kbs.length
          ? `all ${chosen.length} knowledge bases`
          : `${chosen.length} of ${state.kbs.length}: ${names.join(", ")}`;
  const skipped = modelIsCloud() ? chosen.filter((kb) => kb.privacy !== "cloud").length : 0;
  const warning = $("kb-warning");
  warning.hidden = skipped === 0;
  warning.textContent = `${skipped} device only — will be skipped`;
  $("kb-button").title = `Ask in: ${names.join(", ") || "none"}`;
}

function saveSelection() {
  chrome.storage.local.set({ selectedKbs: [...state.selected] });
  renderKbButton();
}

/** @param {boolean} open */
function toggleKbPopover(open) {
  $("kb-popover").hidden = !open;
  $("kb-button").setAttribute("aria-expanded", String(open));
  if (open) {
    const rect = $("ask").getBoundingClientRect();
    $("kb-popover").style.bottom = `${Math.round(window.innerHeight - rect.top + 6)}px`;
    $("kb-filter").focus();
  }
}

// ---- saving the open tab ----

async function addThisTab() {
  const button = /** @type {HTMLButtonElement} */ ($("add-tab"));
  button.disabled = true;
  try {
    const win = await chrome.windows.getCurrent();
    const kb = /** @type {HTMLSelectElement} */ ($("add-to")).value || undefined;
    const job = await chrome.runtime.sendMessage({ type: "save-active-tab", windowId: win.id, kb });
    if (job?.error && !job.id) flashNotice(job.error.message); // a failed job shows in the list
  } finally {
    button.disabled = false;
  }
}

/** The origins the newest failed-for-access save needs, or null when its address is unknown. */
let accessNeeded = /** @type {{origins: string[] | null, jobId: string} | null} */ (null);

async function grantAccess() {
  // Must run straight from the click: Chrome only shows the prompt during a user gesture.
  const origins = accessNeeded?.origins;
  if (!origins?.length) return;
  const granted = await chrome.permissions.request({ origins }).catch(() => false);
  if (granted) {
    $("grant-wrap").hidden = true;
    await addThisTab();
  }
}

async function renderJobs() {
  const all = await chrome.storage.session.get(null);
  const jobs = Object.entries(all)
    .filter(([key]) => key.startsWith("job:"))
    .map(([, job]) => job)
    .sort((a, b) => (b.startedAt ?? 0) - (a.startedAt ?? 0))
    .slice(0, 8);
  const denied = jobs.find((j) => j.state === "failed" && j.error?.code === "no_access");
  accessNeeded = denied ? { origins: denied.error?.detail?.origins ?? null, jobId: denied.id } : null;
  $("grant-wrap").hidden = !denied;
  if (denied) {
    const origins = accessNeeded?.origins;
    const sites = (origins ?? []).map((o) => o.replace(/^\w+:\/\//, "").replace(/\/\*$/, ""));
    $("grant-access").hidden = !origins?.length;
    $("grant-access").textContent = `Allow LocalKB to read pages on ${sites.join(", ")}`;
    $("grant-hint").hidden = Boolean(origins?.length);
    $("grant-hint").textContent =
      "LocalKB could not tell which site this tab is on. Right-click the page and choose “Save page to LocalKB”: that lets it read this one page.";
  }
  const jobsApart = tellApart(jobs.map((job) => ({ label: String(job.title ?? ""), details: jobDetails(job) })));
  const rows = jobs.map((job, i) => {
    const running = job.state === "capturing" || job.state === "saving";
    let kind = job.state;
    if (job.state === "done") kind = job.report?.failed ? "partial" : job.text === "unchanged" ? "unchanged" : "done";
    return el(
      "li",
      { class: `job ${kind}`, dataset: { job: job.id, state: job.state } },
      el("span", { class: "title" }, el("span", { class: "t", text: job.title, title: job.url ?? job.title }),
        jobsApart[i] ? el("span", { class: "d", text: jobsApart[i] }) : null),
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
      el("span", { class: "line", text: jobLine(job) }),
      running && job.total ? el("progress", { max: job.total, value: job.done ?? 0, "aria-label": "Save progress" }) : null,
    );
  });
  setChildren($("jobs"), ...rows);
  $("jobs-empty").hidden = jobs.length > 0;
  const badge = $("saves-badge");
  badge.hidden = jobs.length === 0;
  badge.textContent = String(jobs.length);
  badge.className = jobs.some((j) => j.state === "failed" || j.report?.failed) ? "badge bad" : "badge";
  // One status line for the newest save: what is happening now, or how it ended.
  const newest = jobs[0];
  const status = $("save-status");
  status.hidden = !newest;
  if (newest) {
    const running = newest.state === "capturing" || newest.state === "saving";
    status.textContent = running ? `Saving ${newest.title} · ${progressText(newest)}` : `${newest.title} · ${jobLine(newest)}`;
    status.dataset.kind = newest.state === "done" ? (newest.report?.failed ? "partial" : "done") : newest.state;
    status.title = status.textContent;
  }
  // A bar while the newest save runs: its count when there is one, moving when there is none yet
  // (reading the page, preparing the model).
  const bar = /** @type {HTMLProgressElement} */ ($("save-progress"));
  const running = newest && (newest.state === "capturing" || newest.state === "saving");
  bar.hidden = !running;
  if (running && newest.total && newest.stage !== "model") {
    bar.max = newest.total;
    bar.value = newest.done ?? 0;
  } else {
    bar.removeAttribute("value"); // indeterminate
  }
}

/** @param {any} job */
function jobLine(job) {
  if (job.state === "capturing" || job.state === "saving") return progressText(job);
  if (job.state === "failed") return `Not saved: ${job.text ?? ""}`;
  return `${job.kbName ? `${job.kbName}: ` : ""}${job.text ?? ""}`;
}

/** @param {boolean} open */
function toggleSaves(open) {
  $("saves-panel").hidden = !open;
  $("saves-toggle").setAttribute("aria-expanded", String(open));
}

chrome.storage.onChanged.addListener((changes, area) => {
  if (area !== "session") return;
  const jobChanges = Object.entries(changes).filter(([key]) => key.startsWith("job:"));
  if (!jobChanges.length) return;
  renderJobs();
  const finished = jobChanges.some(([, c]) => c.newValue?.state === "done" && c.oldValue?.state !== "done");
  if (finished && !$("conversation").hidden) loadKnowledgeBases().catch(() => {});
});

// ---- chats ----

async function restoreChat() {
  state.chat = (await chats.current()) ?? newChat();
  renderChat();
}

function renderChat() {
  const box = $("conversation");
  if (!state.chat.turns.length) {
    setChildren(box, emptyChat());
    return;
  }
  setChildren(box);
  state.chat.turns.forEach((turn, index) => {
    const block = assistantBlock();
    box.append(userBlock(turn, index), block.root);
    renderFinal(block, turn, index);
  });
  box.scrollTop = box.scrollHeight;
}

function emptyChat() {
  return el(
    "div",
    { class: "empty-chat", id: "empty-chat" },
    el("p", { text: "Ask a question about what you saved. Every answer says which knowledge bases it searched and cites its passages." }),
    el("p", { class: "muted small-text" }, "Press ", el("kbd", { text: "/" }), " to type a question; earlier chats are under Chats."),
  );
}

async function saveChat() {
  await chats.save(state.chat);
  await chats.setCurrent(state.chat.id);
}

async function startNewChat() {
  if (state.asking) return;
  state.chat = newChat();
  resetPageChat(); // the page's cloud allowance is given per chat
  await chats.setCurrent(state.chat.id);
  renderChat();
  $("question").focus();
}

/** @param {string} id */
async function openChat(id) {
  if (state.asking) return;
  const chat = await chats.get(id);
  if (!chat) return;
  state.chat = chat;
  await chats.setCurrent(id);
  renderChat();
  /** @type {HTMLDialogElement} */ ($("chats")).close();
}

async function renderChatList() {
  const list = await chats.list();
  $("chats-empty").hidden = list.length > 0;
  setChildren(
    $("chat-list"),
    ...list.map((c) => {
      const item = el("li", { class: "chat-item", dataset: { chat: c.id }, "aria-current": String(c.id === state.chat.id) });
      const open = el(
        "button",
        { type: "button", class: "open", title: `Open chat ${c.title}`, onclick: () => openChat(c.id) },
        el("span", { class: "t", text: c.title }),
        el("span", { class: "d", text: `${formatDate(c.updated)} · ${c.questions} question${c.questions === 1 ? "" : "s"}` }),
      );
      const rename = el("button", {
        type: "button",
        class: "small",
        text: "Rename",
        "aria-label": `Rename chat ${c.title}`,
        onclick: () => {
          const input = el("input", { type: "text", value: c.title, "aria-label": "New name", maxlength: 120 });
          const done = async (/** @type {boolean} */ keep) => {
            if (keep) {
              const renamed = await chats.rename(c.id, /** @type {HTMLInputElement} */ (input).value);
              if (renamed && renamed.id === state.chat.id) state.chat = renamed;
            }
            renderChatList();
          };
          input.addEventListener("keydown", (e) => {
            if (e.key === "Enter") done(true);
            if (e.key === "Escape") {
              e.preventDefault();
              done(false);
            }
          });
          item.classList.add("inline");
          setChildren(item, input, el("button", { type: "button", class: "small primary", text: "Save", onclick: () => done(true) }));
          input.focus();
        },
      });
      const remove = el("button", {
        type: "button",
        class: "small danger",
        text: "Delete",
        "aria-label": `Delete chat ${c.title}`,
        onclick: () => {
          item.classList.add("inline");
          setChildren(
            item,
            el("span", { text: `Delete “${c.title}”?` }),
            el("button", {
              type: "button",
              class: "small danger",
              text: "Delete",
              "aria-label": `Yes, delete chat ${c.title}`,
              onclick: async () => {
                await chats.remove(c.id);
                if (c.id === state.chat.id) {
                  state.chat = newChat();
                  renderChat();
                }
                renderChatList();
              },
            }),
            el("button", { type: "button", class: "small", text: "Keep", onclick: () => renderChatList() }),
          );
        },
      });
      item.append(open, rename, remove);
      return item;
    }),
  );
}

// ---- the conversation ----

/**
 * @param {Turn} turn
 * @param {number} index
 */
function userBlock(turn, index) {
  const root = el("div", { class: "turn-user" });
  const show = () => {
    setChildren(
      root,
      el("div", { class: "bubble", text: turn.message }),
      el(
        "div",
        { class: "turn-actions" },
        el("button", { type: "button", class: "link", text: "Edit", "aria-label": "Edit and resend this question", onclick: () => edit() }),
        el("button", { type: "button", class: "link", text: "Copy", "aria-label": "Copy this question", onclick: (/** @type {Event} */ e) => copyText(turn.message, /** @type {HTMLElement} */ (e.target)) }),
      ),
    );
  };
  const edit = () => {
    if (state.asking) return;
    const box = /** @type {HTMLTextAreaElement} */ (el("textarea", { "aria-label": "Edit your question" }));
    box.value = turn.message;
    const send = () => {
      const text = box.value.trim();
      if (!text) return;
      // Like the peers: the edited question is asked again and what followed it is dropped.
      state.chat.turns = state.chat.turns.slice(0, index + 1);
      ask(text, { replace: index, keepAfter: false });
    };
    box.addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
        e.preventDefault();
        send();
      } else if (e.key === "Escape") show();
    });
    setChildren(
      root,
      el(
        "div",
        { class: "edit-box" },
        box,
        el(
          "div",
          { class: "row" },
          el("button", { type: "button", class: "small", text: "Cancel", onclick: () => show() }),
          el("button", { type: "button", class: "small primary", text: "Send", onclick: send }),
        ),
      ),
    );
    box.focus();
  };
  show();
  return root;
}

function assistantBlock() {
  const summary = el("span", { class: "summary-text", text: "Searching…" });
  const steps = el("ul", { class: "steps", "aria-label": "What was searched in each knowledge base" });
  const diag = el("details", { class: "diag" }, el("summary", null, summary), steps);
  const alerts = el("ul", { class: "step-alerts", "aria-label": "Knowledge bases set aside" });
  const confirm = el("div", { class: "confirms" });
  const answer = el("div", { class: "answer" });
  const sources = el("div", { class: "sources" });
  const notes = el("ul", { class: "notes" });
  const meta = el("div", { class: "answer-meta" });
  const actions = el("div", { class: "turn-actions" });
  const root = el("article", { class: "turn-assistant", "aria-label": "Answer" }, diag, alerts, confirm, answer, sources, notes, meta, actions);
  return { root, diag, summary, steps, alerts, confirm, answer, sources, notes, meta, actions };
}

/**
 * History for the host: earlier completed turns, each answer with the knowledge bases it drew
 * on (a turn without them is treated as device only by the host).
 * @param {number} upTo index of the turn being asked
 */
function historyBefore(upTo) {
  const history = [];
  for (const turn of state.chat.turns.slice(0, upTo)) {
    if (turn.error || turn.answer === undefined) continue;
    /** @type {Record<string, any>} */
    const answer = { role: "assistant", content: turn.answer };
    if (Array.isArray(turn.sourceKbs)) answer.kbs = turn.sourceKbs;
    history.push({ role: "user", content: turn.message }, answer);
  }
  return history;
}

/**
 * Ask (or ask again) a question, streaming the answer into the conversation.
 * @param {string} message
 * @param {{weakerKbs?: string[], replace?: number, keepAfter?: boolean, continueFrom?: string, continueKbs?: string[], summarize?: boolean, pageId?: string}} [options]
 *   replace: index of the turn to answer again; continueFrom: the stopped answer to continue,
 *   continueKbs: its provenance (the host's `provenance` event); without it the host treats the
 *   text as device only
 */
async function ask(message, options = {}) {
  if (state.asking) return;
  const kbs = options.replace !== undefined && options.keepAfter !== false
    ? state.chat.turns[options.replace].kbs
    : [...state.selected];
  // The open page (pagechat.js), searched beside the knowledge bases when one is attached.
  const page = await pageRequest(options.pageId).catch((err) => {
    flashNotice(`This page could not be read again: ${err.message}`);
    return null;
  });
  if (!kbs.length && !page) {
    flashNotice("Pick at least one knowledge base to ask (Ask in, above the question box).");
    return;
  }
  $("empty-chat")?.remove();
  const box = $("conversation");
  const index = options.replace ?? state.chat.turns.length;
  const history = historyBefore(index);
  const endpoint = state.endpoint === NO_MODEL ? null : state.endpoint;
  /** @type {Turn} */
  const turn = { message, kbs, endpoint, weakerKbs: options.weakerKbs ?? [] };
  // A summary asked again (Regenerate, Try again) is a summary again.
  const summarize = options.summarize ?? (options.replace !== undefined && Boolean(state.chat.turns[options.replace]?.summarize));
  if (summarize) turn.summarize = true;
  const block = assistantBlock();
  if (options.replace === undefined) {
    box.append(userBlock(turn, index), block.root);
    state.chat.turns.push(turn);
  } else {
    state.chat.turns[index] = turn;
    renderChat();
    const blocks = box.querySelectorAll(".turn-assistant");
    blocks[index]?.replaceWith(block.root);
  }
  block.answer.classList.add("streaming");
  block.answer.setAttribute("aria-busy", "true");
  scrollToNewest(); // asking follows the new answer again

  const controller = new AbortController();
  state.asking = controller;
  setAsking(true);
  const stepsByKb = new Map();
  const prefix = options.continueFrom ?? "";
  let streamed = prefix;
  let frame = 0;
  // Between the search and the first token a model may take long to load: say so, with the time.
  let waiting = 0;
  const startWaiting = () => {
    if (!endpoint || waiting || streamed !== prefix) return;
    const since = Date.now();
    const name = state.endpoints.find((e) => e.name === endpoint)?.name ?? endpoint;
    const tick = () => {
      block.summary.textContent = `Waiting for ${name}… ${Math.floor((Date.now() - since) / 1000)} s`;
    };
    tick();
    waiting = setInterval(tick, 1000);
  };
  const stopWaiting = () => {
    if (waiting) clearInterval(waiting);
    waiting = -1; // never again in this turn
  };
  let requestId = "";
  /** @type {Record<string, any>} */
  const data = { message, history };
  if (kbs.length) data.kbs = kbs;
  if (page) Object.assign(data, page);
  if (summarize) data.summarize = true;
  if (endpoint) data.endpoint = endpoint;
  else if (state.endpoints.length) data.extractive = true; // chosen; without endpoints the host says so itself
  if (turn.weakerKbs?.length) data.use_weaker_matches = turn.weakerKbs;
  if (prefix) {
    data.continue_from = prefix;
    if (Array.isArray(options.continueKbs)) data.continue_kbs = options.continueKbs;
  }
  // Asking the same turn again wants a new answer, not the cached one.
  if (options.replace !== undefined) data.regenerate = true;
  try {
    const result = await host.request("chat", data, {
      signal: controller.signal,
      onId: (id) => {
        requestId = id;
      },
      onEvent: (event, payload) => {
        if (event === "step") {
          const li = stepItem(payload, turn, index, true);
          const old = stepsByKb.get(payload.kb);
          if (old) old.replaceWith(li);
          else block.steps.append(li);
          stepsByKb.set(payload.kb, li);
          if (waiting === 0) block.summary.textContent = `Searching… ${stepsByKb.size} of ${kbs.length + (page ? 1 : 0)} done`;
          renderAlerts(block, [...stepsByKb.keys()].map((k) => stepsByKb.get(k).__status), turn, index);
          if (stepsByKb.size >= kbs.length + (page ? 1 : 0)) startWaiting();
        } else if (event === "provenance") {
          // Every knowledge base that reached the prompt, sent before the first token: a turn
          // stopped mid-stream keeps it, so its text goes on only where the gate allows.
          if (Array.isArray(payload?.kbs)) turn.sourceKbs = payload.kbs;
          startWaiting(); // the prompt is built: what follows is the model
        } else if (event === "token") {
          if (waiting !== -1) {
            stopWaiting();
            block.summary.textContent = `${endpoint ?? "The model"} is writing…`;
          }
          streamed += payload?.text ?? "";
          // Markdown is re-rendered at most once per frame while the answer grows.
          if (!frame) {
            frame = requestAnimationFrame(() => {
              frame = 0;
              setChildren(block.answer, renderMarkdown(streamed));
              followNewest();
            });
          }
        } else if (event === "confirm") {
          block.confirm.append(confirmCard(payload, requestId));
          followNewest();
        }
      },
    });
    if (state.hostDown) setHostDown(false);
    Object.assign(turn, {
      answer: result.answer ?? streamed,
      citations: result.citations ?? [],
      statuses: result.statuses ?? [],
      summary: result.summary,
      answer_line: result.answer_line,
      notes: result.notes ?? [],
      model: result.model ?? null,
      generated: Boolean(result.generated),
      rewritten_query: result.rewritten_query,
      sourceKbs: Array.isArray(result.kbs) ? result.kbs : undefined,
      tool_calls: result.tool_calls ?? [],
      model_error: result.model_error ?? null,
    });
    if (endpoint) {
      if (result.model_error) state.modelProblems.set(endpoint, result.model_error.message);
      else if (result.generated) state.modelProblems.delete(endpoint);
      renderModel();
    }
  } catch (err) {
    const e = /** @type {HostError} */ (err);
    if (e.code === "cancelled") {
      turn.stopped = true;
      turn.answer = streamed;
      if (prefix && streamed === prefix) turn.stopped = true;
    } else {
      turn.error = { code: e.code ?? "error", message: e.message };
      if (streamed) turn.answer = streamed;
    }
    turn.statuses = [...stepsByKb.values()].map((li) => li.__status);
    if (isHostMissing(e)) showHostProblem(e);
    else if (HOST_GONE.has(e.code)) setHostDown(true);
  } finally {
    if (frame) cancelAnimationFrame(frame);
    stopWaiting();
  }
  try {
    for (const card of block.confirm.querySelectorAll(".confirm-card")) settleConfirm(/** @type {any} */ (card), turn);
    renderFinal(block, turn, index);
    // The turn is over once it is stored: a panel (or browser) closed right after keeps it.
    await saveChat();
  } finally {
    state.asking = null;
    setAsking(false);
  }
  followNewest();
}

// ---- following the newest text ----

const FOLLOW_SLACK_PX = 40;

/** Keep the newest text in view, unless the reader has scrolled up to read. */
function followNewest() {
  if (state.follow) $("conversation").scrollTop = $("conversation").scrollHeight;
  else $("scroll-bottom").hidden = false;
}

/** Scroll to the newest text and follow it again. */
function scrollToNewest() {
  state.follow = true;
  $("scroll-bottom").hidden = true;
  $("conversation").scrollTop = $("conversation").scrollHeight;
}

/** A scroll away from the bottom (by the reader) stops following; back at the bottom resumes it. */
function onConversationScroll() {
  const box = $("conversation");
  const atBottom = box.scrollHeight - box.scrollTop - box.clientHeight <= FOLLOW_SLACK_PX;
  state.follow = atBottom;
  $("scroll-bottom").hidden = atBottom;
}

/**
 * Render a finished (or failed, or stopped) answer.
 * @param {ReturnType<typeof assistantBlock>} block
 * @param {Turn} turn
 * @param {number} index
 */
function renderFinal(block, turn, index) {
  block.answer.classList.remove("streaming");
  block.answer.removeAttribute("aria-busy");
  const statuses = turn.statuses ?? [];
  setChildren(block.steps, ...statuses.map((s) => stepItem(s, turn, index, false)));
  renderAlerts(block, statuses, turn, index);
  block.summary.textContent = turn.summary || (statuses.length ? statuses.map((s) => stepLine(s)).join(" · ") : "Not searched");
  block.diag.hidden = statuses.length === 0 && !turn.summary;
  if (turn.tool_calls?.length && !block.confirm.childElementCount) {
    for (const call of turn.tool_calls) block.confirm.append(toolOutcome(call));
  }
  const citations = turn.citations ?? [];
  const byN = new Map(citations.map((c) => [c.n, c]));
  setChildren(
    block.answer,
    turn.answer ? renderMarkdown(turn.answer, { citations, onCite: (n) => openPassage(byN.get(n)) }) : null,
  );
  block.answer.hidden = !turn.answer;
  const apart = tellApart(citations.map((c) => ({ label: c.title || c.url || "passage", details: citationDetails(c) })));
  setChildren(
    block.sources,
    ...citations.map((c, i) =>
      el(
        "button",
        { type: "button", class: "small chip", title: `${c.kb_name ?? ""} · ${c.title ?? ""}${apart[i] ? ` · ${apart[i]}` : ""}`, onclick: () => openPassage(c) },
        el("span", { class: "t", text: `[${c.n}] ${c.title || c.url || "passage"}` }),
        apart[i] ? el("span", { class: "d", text: apart[i] }) : null,
      ),
    ),
  );
  // Skipped and unavailable knowledge bases already have their own lines above.
  const shown = new Set(statuses.filter((s) => s.status === "skipped" || s.status === "unavailable").map((s) => s.kb_name));
  // ...and a model's write request has its card, which says how it ended.
  const carded = block.confirm.childElementCount > 0;
  const failedNote = turn.model_error ? `The model ${turn.model_error.endpoint} failed` : null;
  const notes = (turn.notes ?? []).filter(
    (n) =>
      !(failedNote && n.startsWith(failedNote)) &&
      ![...shown].some((name) => n.startsWith(`${name} was not searched`) || n.startsWith(`The search of ${name} did not run`)) &&
      !(carded && (n.startsWith("add_to_knowledge_base:") || n.startsWith("Saved “"))),
  );
  setChildren(block.notes, ...notes.map((n) => el("li", { text: n })));
  const meta = [];
  if (turn.answer_line) meta.push(turn.answer_line);
  else if (!turn.error && !turn.stopped && turn.answer !== undefined) {
    meta.push(turn.generated && turn.model ? `Answered by ${modelLine(turn.model)}` : "Quoted from your passages");
  }
  if (turn.rewritten_query && turn.rewritten_query.trim() !== turn.message.trim()) meta.push(`Searched for “${turn.rewritten_query}”`);
  setChildren(block.meta, ...meta.map((m) => el("span", { text: m })));
  block.root.querySelector(".answer-error")?.remove();
  block.root.querySelector(".stopped")?.remove();
  if (turn.error) block.meta.before(errorBox(turn, index));
  // A model that failed: its reason comes first, the quoted passages after it.
  else if (turn.model_error) block.answer.before(modelErrorBox(turn, index));
  if (turn.stopped) block.meta.before(el("p", { class: "stopped", text: "Stopped before the answer was finished." }));
  const actions = [];
  if (turn.answer) {
    actions.push(el("button", { type: "button", class: "link", text: "Copy", "aria-label": "Copy this answer", onclick: (/** @type {Event} */ e) => copyText(turn.answer ?? "", /** @type {HTMLElement} */ (e.target)) }));
  }
  if (turn.stopped && turn.answer && turn.endpoint) {
    actions.push(el("button", { type: "button", class: "link", text: "Continue", "aria-label": "Continue this answer", onclick: () => ask(turn.message, { replace: index, continueFrom: turn.answer, continueKbs: turn.sourceKbs, weakerKbs: turn.weakerKbs }) }));
  }
  actions.push(el("button", { type: "button", class: "link", text: "Regenerate", "aria-label": "Regenerate this answer", onclick: () => ask(turn.message, { replace: index }) }));
  setChildren(block.actions, ...actions);
}

/**
 * What can tell a cited passage from another of the same title: its knowledge base, its site,
 * its path (or file), its place in the source.
 * @param {any} c
 * @returns {string[]}
 */
function citationDetails(c) {
  const details = [c.kb_name ?? ""];
  try {
    const url = new URL(c.url);
    details.push(url.host, url.pathname.split("/").filter(Boolean).slice(-2).join("/"));
  } catch {
    details.push("", c.file_name ?? "");
  }
  if (Number.isInteger(c.chunk_index)) details.push(`passage ${c.chunk_index + 1}`);
  return details;
}

/**
 * What tells one save from another of the same title: its site, its path, its knowledge base.
 * @param {any} job
 * @returns {string[]}
 */
function jobDetails(job) {
  try {
    const url = new URL(job.url);
    return [url.host, url.pathname.split("/").filter(Boolean).slice(-2).join("/"), job.kbName ?? ""];
  } catch {
    return ["", "", job.kbName ?? ""];
  }
}

/**
 * Skipped and unavailable knowledge bases stay visible under the summary, folded or not.
 * @param {ReturnType<typeof assistantBlock>} block
 * @param {any[]} statuses
 * @param {Turn} turn
 * @param {number} index
 */
function renderAlerts(block, statuses, turn, index) {
  const aside = statuses.filter((s) => s && (s.status === "skipped" || s.status === "unavailable"));
  setChildren(block.alerts, ...aside.map((s) => stepItem(s, turn, index, false, true)));
}

/**
 * What went wrong, in words that say what to do, with a way to try again.
 * @param {Turn} turn
 * @param {number} index
 */
function errorBox(turn, index) {
  const error = /** @type {{code: string, message: string}} */ (turn.error);
  const gone = HOST_GONE.has(error.code);
  const box = el("div", { class: "answer-error", role: "alert" });
  const text = gone
    ? "The LocalKB host stopped while answering. Try again starts it again; if it stops again, its log below says why."
    : error.code === "llm_unavailable"
      ? `The model could not answer: ${error.message} Check that it is running, or choose another model (or No model) above.`
      : error.message;
  box.append(el("p", { text }));
  const row = el("div", { class: "row" });
  row.append(el("button", { type: "button", class: "small primary", text: "Try again", onclick: () => ask(turn.message, { replace: index }) }));
  if (gone) {
    const log = el("pre", { hidden: true });
    row.append(
      el("button", {
        type: "button",
        class: "small",
        text: "What the log says",
        onclick: async () => {
          log.hidden = false;
          log.textContent = "Reading the host's error log…";
          try {
            const { errors = [] } = await host.request("errors.list", { limit: 5 });
            setHostDown(false);
            log.textContent = errors.length
              ? errors.map((/** @type {any} */ e) => `${formatDate(e.at)} · ${e.source} · ${e.code}: ${e.message}`).join("\n")
              : "The host's log has no errors: it was probably stopped from outside (closed, killed or out of memory).";
          } catch (err) {
            log.textContent = `The host did not start again: ${/** @type {Error} */ (err).message}`;
          }
        },
      }),
    );
    box.append(row, log);
  } else {
    box.append(row);
  }
  return box;
}

/**
 * The model was asked and failed: why, first, and what the quotes below are.
 * @param {Turn} turn
 * @param {number} index
 */
function modelErrorBox(turn, index) {
  const failure = /** @type {{endpoint: string, message: string}} */ (turn.model_error);
  const box = el("div", { class: "answer-error", role: "alert" });
  box.append(
    el("p", { text: `${failure.endpoint} did not answer: ${failure.message}` }),
    el("p", { class: "small-text", text: "Below, the best passages are quoted instead. Check that the model is running, or choose another one above." }),
    el("div", { class: "row" }, el("button", { type: "button", class: "small primary", text: "Try again", onclick: () => ask(turn.message, { replace: index }) })),
  );
  return box;
}

/**
 * One step line with its actions, named for the knowledge base they act on.
 * @param {any} status
 * @param {Turn} turn
 * @param {number} index
 * @param {boolean} live while the answer streams the actions wait
 * @param {boolean} [alert] shown outside the folded list (skipped, unavailable)
 */
function stepItem(status, turn, index, live, alert = false) {
  const name = status.kb_name || status.kb;
  const text = stepLine(status);
  const actions = el("span", { class: "actions" });
  if (!live && canUseWeaker(status) && !turn.weakerKbs?.includes(status.kb)) {
    actions.append(
      el("button", {
        type: "button",
        class: "link",
        text: `Use weaker matches from ${name}`,
        onclick: () => ask(turn.message, { weakerKbs: [...(turn.weakerKbs ?? []), status.kb], replace: index }),
      }),
    );
  }
  if (!live && !alert && canTestSearch(status)) {
    actions.append(
      el("button", {
        type: "button",
        class: "link",
        text: `Test this search in ${name}`,
        onclick: () => testSearch(status, turn.rewritten_query || turn.message),
      }),
    );
  }
  // An unavailable search says why in the host's words: which one, and that it says nothing
  // about what is stored.
  const why = status.status === "unavailable" && status.message && status.message.trim() !== text
    ? el("span", { class: "why", text: status.message })
    : null;
  const li = el(
    "li",
    { class: "step", dataset: { status: status.status, kb: status.kb ?? "" } },
    el("span", { class: "text", text }),
    why,
    actions.childElementCount ? actions : null,
  );
  /** @type {any} */ (li).__status = status;
  return li;
}

// ---- a model's request to write ----

/**
 * The Approve / Decline card for a `confirm` event: where it would write, the whole text,
 * and the time left before the host counts silence as "no".
 * @param {any} request
 * @param {string} target the chat request's id
 */
function confirmCard(request, target) {
  const text = String(request?.text ?? "");
  const chars = Number.isInteger(request?.chars) ? request.chars : text.length;
  const complete = text.length === chars;
  const card = el("section", { class: "confirm-card", "aria-label": "A model wants to save a note", dataset: { state: "waiting", call: request?.call_id ?? "" } });
  const countdown = el("span", { class: "countdown", role: "timer" });
  const approve = /** @type {HTMLButtonElement} */ (el("button", { type: "button", class: "small primary", text: "Approve", disabled: !complete }));
  const decline = /** @type {HTMLButtonElement} */ (el("button", { type: "button", class: "small", text: "Decline" }));
  const deadline = Date.now() + (Number(request?.expires_in_s) || 600) * 1000;
  const answer = async (/** @type {boolean} */ yes) => {
    approve.disabled = true;
    decline.disabled = true;
    clearInterval(timer);
    card.dataset.state = yes ? "approved" : "declined";
    card.dataset.answered = "true";
    countdown.textContent = yes ? "Approved: writing…" : "Declined: nothing will be written.";
    try {
      const { delivered } = await host.request("chat.confirm", { target, call_id: request.call_id, approve: yes });
      if (!delivered) countdown.textContent = "The host was no longer waiting: nothing was written.";
    } catch (err) {
      countdown.textContent = `Could not answer the host: ${/** @type {Error} */ (err).message}`;
    }
  };
  approve.addEventListener("click", () => answer(true));
  decline.addEventListener("click", () => answer(false));
  const tick = () => {
    const left = Math.max(0, Math.round((deadline - Date.now()) / 1000));
    if (left === 0) {
      clearInterval(timer);
      approve.disabled = true;
      decline.disabled = true;
      card.dataset.state = "timeout";
      countdown.textContent = "No answer in time: declined, nothing was written.";
      return;
    }
    const m = Math.floor(left / 60);
    countdown.textContent = `Waiting for your answer · ${m ? `${m} min ` : ""}${left % 60} s left, then it counts as Decline`;
  };
  const timer = setInterval(tick, 1000);
  tick();
  card.append(
    el("h3", { text: `Save a note to ${request?.kb_name ?? request?.kb ?? "a knowledge base"}?` }),
    el(
      "dl",
      { class: "facts" },
      el("dt", { text: "Knowledge base" }),
      el("dd", { text: request?.kb_name ?? request?.kb ?? "–" }),
      el("dt", { text: "Title" }),
      el("dd", { text: request?.title ?? "–" }),
      el("dt", { text: "Length" }),
      el("dd", { text: `${chars.toLocaleString()} characters${complete ? ", all shown below" : ""}` }),
    ),
    el("pre", { class: "confirm-text", tabindex: "0", "aria-label": "The exact text that would be saved", text }),
  );
  if (!complete) {
    card.append(
      el("p", {
        class: "notice",
        text: `Only ${text.length.toLocaleString()} of ${chars.toLocaleString()} characters arrived, so this cannot be approved: you would not see what is written.`,
      }),
    );
  }
  card.append(el("div", { class: "row" }, approve, decline, countdown));
  /** @type {any} */ (card).__timer = timer;
  return card;
}

/**
 * After the turn ends, a card shows what the host did with the request.
 * @param {HTMLElement & {__timer?: any}} card
 * @param {Turn} turn
 */
function settleConfirm(card, turn) {
  clearInterval(card.__timer);
  for (const b of card.querySelectorAll("button")) /** @type {HTMLButtonElement} */ (b).disabled = true;
  const call = (turn.tool_calls ?? []).find((c) => c.call_id === card.dataset.call);
  const countdown = card.querySelector(".countdown");
  if (call && countdown) {
    // Not answered here and not written: the host's wait ran out (its reply can beat our clock).
    const timedOut = call.status !== "written" && card.dataset.answered !== "true";
    card.dataset.state = call.status === "written" ? "approved" : timedOut ? "timeout" : "declined";
    countdown.textContent = call.status === "written"
      ? `Saved: ${call.reason}`
      : `${timedOut ? "No answer in time. " : ""}Not written: ${call.reason}`;
  } else if (countdown && card.dataset.state === "waiting") {
    countdown.textContent = "The turn ended before an answer: nothing was written.";
  }
}

/**
 * A stored turn's write request, as it ended (shown when a chat is reopened).
 * @param {any} call
 */
function toolOutcome(call) {
  return el(
    "p",
    { class: "notice" },
    call.status === "written" ? `Saved “${call.title}” to ${call.kb_name}: ${call.reason}` : `A request to save a note was ${call.status}: ${call.reason}`,
  );
}

/** @param {boolean} asking */
function setAsking(asking) {
  document.body.dataset.asking = String(asking);
  /** @type {HTMLButtonElement} */ ($("send")).disabled = asking;
  $("stop").hidden = !asking;
  $("new-chat").disabled = asking;
}

/** @param {string} text */
function flashNotice(text) {
  const notice = el("p", { class: "notice", role: "alert", text });
  $("conversation").append(notice);
  $("conversation").scrollTop = $("conversation").scrollHeight;
  setTimeout(() => notice.remove(), 6000);
}

// ---- passage card and search test ----

/** @param {any} citation */
function openPassage(citation) {
  if (!citation) return;
  $("passage-title").textContent = `Passage [${citation.n}]`;
  setChildren(
    $("passage-facts"),
    ...passageFacts(citation).flatMap((f) => [el("dt", { text: f.label }), el("dd", { text: f.value })]),
  );
  setChildren($("passage-text"), renderMarkdown(citation.text ?? ""));
  const link = /** @type {HTMLAnchorElement} */ ($("passage-link"));
  const href = sourceLink(citation);
  link.hidden = href === null;
  if (href) link.href = href;
  /** @type {HTMLDialogElement} */ ($("passage-card")).showModal();
}

/**
 * "Test this search": run the search for one knowledge base with weaker matches included
 * and draw every hit's similarity against the cut-off.
 * @param {any} status
 * @param {string} query
 */
async function testSearch(status, query) {
  const dialog = /** @type {HTMLDialogElement} */ ($("search-test"));
  $("search-test-title").textContent = `Test this search in ${status.kb_name ?? status.kb}`;
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
  $("search-test-status").textContent = stepLine(kbStatus);
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
      el("span", { class: "bar-title", text: `${row.label} · search rank ${row.rank}`, title: row.label }),
      el("span", { class: "bar-snippet", text: passageSnippet(row.hit.text, row.hit.title) }),
      el(
        "div",
        { class: "bar-track" },
        el("div", { class: `bar-fill ${row.above ? "above" : "below"}`, style: { width: `${row.pct}%` } }),
        layout.cutoffPct === null ? null : el("div", { class: "cutoff-tick", style: { left: `${layout.cutoffPct}%` }, "aria-hidden": "true" }),
      ),
      el("span", { class: "bar-score", text: scoreWords(row) }),
    ),
  );
  const area = el("div", { class: "bar-area" }, ...rows);
  if (layout.cutoffPct !== null) {
    // The label sits inside the chart: on the right of the line, or on its left near the edge.
    const side = layout.cutoffPct > 60 ? "left" : "right";
    area.append(
      el(
        "div",
        { class: "cutoff-line", style: { left: `${layout.cutoffPct}%` }, "aria-hidden": "true", dataset: { cutoff: String(cutoff) } },
        el("span", { class: `cutoff-label ${side === "left" ? "right" : "left"}`, style: side === "left" ? { right: "0.3rem" } : { left: "0.3rem" }, text: `cut-off ${formatScore(cutoff)}` }),
      ),
    );
  }
  chart.setAttribute(
    "aria-label",
    `${hits.length} passages; ${layout.rows.filter((r) => r.above).length} at or above the cut-off of ${formatScore(cutoff)}`,
  );
  setChildren(
    chart,
    area,
    el("div", { class: "axis" }, el("span", { text: `similarity ${formatScore(layout.min)}` }), el("span", { text: formatScore(layout.max) })),
  );
}

/**
 * "similarity 0.56 · relevant · also a keyword match".
 * @param {import("./render.js").ScoreRow} row
 */
function scoreWords(row) {
  const parts = [row.value === null ? "similarity not known (keyword match only)" : `similarity ${formatScore(row.value)}`];
  parts.push(row.above ? "relevant" : "weaker");
  if (typeof row.hit.bm25 === "number" && row.hit.bm25 > 0) {
    parts.push(row.hit.matched_terms ? `keyword match (${row.hit.matched_terms} word${row.hit.matched_terms === 1 ? "" : "s"})` : "keyword match");
  }
  return parts.join(" · ");
}

// ---- keyboard and wiring ----

document.addEventListener("click", (e) => {
  const target = /** @type {HTMLElement} */ (e.target);
  if (target.matches("[data-close]")) /** @type {HTMLDialogElement} */ (target.closest("dialog"))?.close();
  if (!$("kb-popover").hidden && !target.closest("#kb-popover") && !target.closest("#kb-button")) toggleKbPopover(false);
  if (!$("saves-panel").hidden && !target.closest("#savebar")) toggleSaves(false);
});
for (const dialog of document.querySelectorAll("dialog")) {
  // A click on the backdrop (the dialog element itself, outside its content) closes it.
  dialog.addEventListener("click", (e) => {
    if (e.target === dialog) /** @type {HTMLDialogElement} */ (dialog).close();
  });
}
document.addEventListener("keydown", (e) => {
  const target = /** @type {HTMLElement} */ (e.target);
  const typing = target.matches("input, textarea, select, [contenteditable]");
  if (e.key === "Escape") {
    if (!$("kb-popover").hidden) {
      toggleKbPopover(false);
      $("kb-button").focus();
    } else if (!$("saves-panel").hidden) {
      toggleSaves(false);
    } else if (state.asking && !document.querySelector("dialog[open]")) {
      state.asking.abort();
    }
  } else if (e.key === "/" && !typing && !e.ctrlKey && !e.metaKey && !e.altKey) {
    e.preventDefault();
    $("question").focus();
  }
});
$("ask").addEventListener("submit", (e) => {
  e.preventDefault();
  const box = /** @type {HTMLTextAreaElement} */ ($("question"));
  const message = box.value.trim();
  if (!message || state.asking) return;
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
$("conversation").addEventListener("scroll", onConversationScroll, { passive: true });
$("scroll-bottom").addEventListener("click", () => scrollToNewest());
$("new-chat").addEventListener("click", () => startNewChat());
$("chats-new").addEventListener("click", async () => {
  /** @type {HTMLDialogElement} */ ($("chats")).close();
  await startNewChat();
});
$("chats-button").addEventListener("click", async () => {
  await renderChatList();
  /** @type {HTMLDialogElement} */ ($("chats")).showModal();
});
$("kb-button").addEventListener("click", () => toggleKbPopover($("kb-popover").hidden));
$("kb-filter").addEventListener("input", () => renderKnowledgeBases());
$("kb-all").addEventListener("click", () => {
  state.selected = new Set(state.kbs.map((kb) => kb.id));
  saveSelection();
  renderKnowledgeBases();
});
$("kb-none").addEventListener("click", () => {
  state.selected = new Set();
  saveSelection();
  renderKnowledgeBases();
});
$("saves-toggle").addEventListener("click", () => toggleSaves($("saves-panel").hidden));
$("add-tab").addEventListener("click", () => addThisTab());
$("grant-access").addEventListener("click", () => grantAccess());
$("endpoint").addEventListener("change", (e) => {
  state.endpoint = /** @type {HTMLSelectElement} */ (e.target).value;
  chrome.storage.local.set({ endpoint: state.endpoint });
  renderModel();
});
// The "Focus the question box" command (service worker) reaches an open panel here.
chrome.runtime.onMessage.addListener((message) => {
  if (message?.type === "focus-question") {
    window.focus();
    $("question").focus();
  }
  return false;
});

connect();
