// The options page: knowledge bases (create, rename, privacy, delete, sources,
// export, import), model endpoints, and the host's status and error log.
// Every action goes to the host through native.js and the page shows the
// host's answer, counts included.

import { el, formatBytes, formatDate, hostMissingNotice, setChildren } from "./dom.js";
import { addEndpointSetup } from "./endpoints.js";
import { rememberKnowledgeBases, setDefaultKnowledgeBase } from "./kbs.js";
import { HostError, NativeHost } from "./native.js";
import { base64ToBytes, bytesToBase64, splitBytes } from "./parts.js";
import { isHostMissing, locationWords, privacyLabel } from "./render.js";

const host = new NativeHost();
/** Raw bytes per import part: 3/4 MiB becomes 1 MiB of base64, well under Chrome's 64 MiB. */
const IMPORT_PART_BYTES = 768 * 1024;
const SOURCES_PAGE = 25;

/**
 * @param {string} id
 * @returns {any}
 */
const $ = (id) => document.getElementById(id);

const state = {
  /** @type {any[]} */ kbs: [],
  /** @type {string | null} */ defaultKb: null,
  /** @type {{kb: any, offset: number, total: number} | null} */ sources: null,
};

/**
 * "1 source", "3 sources": a count with its noun in singular or plural.
 * @param {number} n
 * @param {string} word
 */
const count = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;

// ---- small dialogs ----

/**
 * Ask for confirmation of something that cannot be undone.
 * @param {string} text
 * @param {string} [action]
 * @returns {Promise<boolean>}
 */
function confirmAction(text, action = "Delete") {
  const dialog = /** @type {HTMLDialogElement} */ ($("confirm"));
  $("confirm-text").textContent = text;
  $("confirm-ok").textContent = action;
  dialog.returnValue = "";
  dialog.showModal();
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
  });
}

/**
 * Ask for a line of text (a name, a passphrase).
 * @param {{title: string, label: string, hint?: string, value?: string, password?: boolean, required?: boolean, ok?: string, maxLength?: number}} opts
 * @returns {Promise<string | null>} null when cancelled
 */
function askText(opts) {
  const dialog = /** @type {HTMLDialogElement} */ ($("ask-text"));
  const input = /** @type {HTMLInputElement} */ ($("ask-text-input"));
  $("ask-text-title").textContent = opts.title;
  $("ask-text-label").textContent = opts.label;
  $("ask-text-hint").textContent = opts.hint ?? "";
  $("ask-text-hint").hidden = !opts.hint;
  $("ask-text-ok").textContent = opts.ok ?? "OK";
  input.type = opts.password ? "password" : "text";
  input.value = opts.value ?? "";
  input.required = Boolean(opts.required);
  input.autocomplete = opts.password ? "new-password" : "off";
  if (opts.maxLength) input.maxLength = opts.maxLength;
  else input.removeAttribute("maxlength");
  dialog.returnValue = "";
  dialog.showModal();
  input.select();
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok" ? input.value : null), { once: true });
  });
}

/**
 * @param {string} text
 * @param {boolean} [bad]
 */
function flash(text, bad = false) {
  const node = $("flash");
  node.textContent = text;
  node.className = bad ? "flash bad" : "flash";
  node.hidden = false;
  node.scrollIntoView({ block: "nearest" });
}

/**
 * Run an action, showing the host's error instead of failing silently.
 * @param {() => Promise<void>} fn
 */
async function guarded(fn) {
  try {
    await fn();
  } catch (err) {
    const e = /** @type {HostError} */ (err);
    if (isHostMissing(e)) showHostProblem(e);
    else flash(e.message ?? String(e), true);
  }
}

// ---- host ----

/** The longest knowledge base name the host accepts (its `status.limits.kb_name`). */
let nameMax = 80;

async function connect() {
  setChildren($("host-missing-slot"));
  let status;
  try {
    status = await host.request("status");
  } catch (err) {
    showHostProblem(err);
    return;
  }
  $("app").hidden = false;
  renderHost(status);
  // Names the host would refuse cannot be typed (its limit, not a copy of it).
  nameMax = Number(status?.limits?.kb_name) || nameMax;
  for (const id of ["new-kb-name", "import-name"]) $(id).setAttribute("maxlength", String(nameMax));
  await guarded(loadKnowledgeBases);
  await guarded(loadEndpoints);
  await guarded(loadErrors);
  document.body.dataset.ready = "true";
}

/** @param {unknown} err */
function showHostProblem(err) {
  const e = /** @type {HostError} */ (err);
  $("app").hidden = true;
  setChildren(
    $("host-missing-slot"),
    hostMissingNotice({ code: e?.code, message: isHostMissing(e) ? undefined : e?.message, onRetry: () => connect() }),
  );
}

/** @param {any} status */
function renderHost(status) {
  const model = status.model ?? {};
  const modelText = [model.id, model.variant].filter(Boolean).join(" · ") || "–";
  const modelState = model.error ? `error: ${model.error}` : model.loaded ? "loaded" : "loads on first use";
  // The host may not have judged the location yet at a cold start (null); loadEndpoints
  // fills this fact in again from config.get, which always carries the host's verdict.
  const endpoint = status.endpoint?.name
    ? `${status.endpoint.name} · ${locationWords(status.endpoint.location).text}`
    : "none (answers quote your passages)";
  const facts = [
    ["Host version", status.host_version ?? "–"],
    ["Protocol", String(status.protocol_version ?? "–")],
    ["Embedding model", `${modelText} (${modelState})`],
    ["Default answer model", endpoint],
    ["Data folder", status.data_dir ?? "–"],
  ];
  setChildren($("host-facts"), ...facts.flatMap(([k, v]) => [el("dt", { text: k }), el("dd", { text: v })]));
}

async function loadErrors() {
  const { errors = [], total = 0 } = await host.request("errors.list", { limit: 50 });
  setChildren(
    $("errors-table").tBodies[0],
    ...errors.map((/** @type {any} */ e) =>
      el(
        "tr",
        null,
        el("td", { text: formatDate(e.at) }),
        el("td", { text: [kbName(e.kb), e.source].filter(Boolean).join(" · ") || "–" }),
        el("td", null, el("code", { text: e.code ?? "–" })),
        el("td", { class: "message", text: e.message ?? "" }),
      ),
    ),
  );
  $("errors-table").hidden = errors.length === 0;
  $("errors-none").hidden = errors.length > 0;
  $("errors-none").textContent = total ? `${total} errors recorded.` : "No errors recorded.";
}

/**
 * A knowledge base as people know it: by name (errors carry ids).
 * @param {string | null | undefined} id
 */
function kbName(id) {
  if (!id) return null;
  const kb = state.kbs.find((k) => k.id === id);
  return kb ? kb.name : `a deleted knowledge base (${id})`;
}

// ---- knowledge bases ----

async function loadKnowledgeBases() {
  const { knowledge_bases: kbs } = await host.request("kb.list");
  state.kbs = kbs;
  state.defaultKb = await rememberKnowledgeBases(kbs);
  renderKnowledgeBases();
}

function renderKnowledgeBases() {
  const rows = state.kbs.map((kb) =>
    el(
      "tr",
      { class: kb.id === state.defaultKb ? "default" : "", dataset: { kb: kb.id } },
      el("td", { text: kb.name }),
      el(
        "td",
        null,
        el(
          "select",
          {
            "aria-label": `Privacy of ${kb.name}`,
            onchange: (/** @type {Event} */ e) =>
              guarded(async () => {
                const privacy = /** @type {HTMLSelectElement} */ (e.target).value;
                await host.request("kb.update", { kb: kb.id, privacy });
                flash(`${kb.name} is now ${privacyLabel(privacy)}.`);
                await loadKnowledgeBases();
              }),
          },
          el("option", { value: "device", selected: kb.privacy !== "cloud", text: "Device only" }),
          el("option", { value: "cloud", selected: kb.privacy === "cloud", text: "Cloud OK" }),
        ),
      ),
      el("td", { class: "num", text: String(kb.sources ?? 0) }),
      el("td", { class: "num", text: String(kb.chunks ?? 0) }),
      el("td", { class: "muted model", text: kb.model ?? "–" }),
      el(
        "td",
        null,
        el(
          "div",
          { class: "actions" },
          button("Sources", `Show the sources of ${kb.name}`, () => openSources(kb, 0)),
          button("Rename", `Rename ${kb.name}`, () => rename(kb)),
          button("Export", `Export ${kb.name}`, () => exportKb(kb)),
          kb.id === state.defaultKb
            ? null
            : button("Make default", `Make default: save to ${kb.name} from the right-click menu`, async () => {
                await setDefaultKnowledgeBase(kb.id);
                state.defaultKb = kb.id;
                renderKnowledgeBases();
              }),
          button("Delete", `Delete ${kb.name}`, () => deleteKb(kb), "danger"),
        ),
      ),
    ),
  );
  setChildren($("kb-table").tBodies[0], ...rows);
  $("kb-table").hidden = state.kbs.length === 0;
  $("kb-none").hidden = state.kbs.length > 0;
}

/**
 * @param {string} text
 * @param {string} label
 * @param {() => unknown} onclick
 * @param {string} [extra]
 */
function button(text, label, onclick, extra = "") {
  return el("button", { type: "button", class: `small ${extra}`.trim(), text, "aria-label": label, onclick: () => guarded(async () => onclick()) });
}

/** @param {any} kb */
async function rename(kb) {
  const name = await askText({ title: "Rename knowledge base", label: "Name", value: kb.name, required: true, ok: "Rename", maxLength: nameMax });
  if (name === null || !name.trim() || name.trim() === kb.name) return;
  await host.request("kb.update", { kb: kb.id, name: name.trim() });
  flash(`Renamed to ${name.trim()}.`);
  await loadKnowledgeBases();
}

/** @param {any} kb */
async function deleteKb(kb) {
  const ok = await confirmAction(
    `Delete "${kb.name}" with its ${count(kb.sources ?? 0, "source")} and ${count(kb.chunks ?? 0, "passage")}? This cannot be undone; export it first to keep a copy.`,
  );
  if (!ok) return;
  await host.request("kb.delete", { kb: kb.id });
  flash(`Deleted ${kb.name}.`);
  if (state.sources?.kb.id === kb.id) closeSources();
  await loadKnowledgeBases();
}

// ---- sources ----

/**
 * @param {any} kb
 * @param {number} offset
 */
async function openSources(kb, offset) {
  const { sources = [], total = 0 } = await host.request("source.list", { kb: kb.id, offset, limit: SOURCES_PAGE });
  state.sources = { kb, offset, total };
  $("sources-card").hidden = false;
  $("sources-title").textContent = `Sources in ${kb.name}`;
  setChildren(
    $("sources-list"),
    ...sources.map((/** @type {any} */ s) =>
      el(
        "li",
        { dataset: { source: s.id } },
        el("span", { class: "title" }, s.url && /^https?:/i.test(s.url) ? el("a", { href: s.url, target: "_blank", rel: "noopener noreferrer", text: s.title || s.url }) : s.title || s.url || "untitled"),
        el("span", {
          class: "meta",
          text: [s.type, count(s.chunks ?? 0, "passage"), s.captured_by, formatDate(s.added_at)].filter(Boolean).join(" · "),
        }),
        button("Remove", `Remove ${s.title || s.url}`, async () => {
          const ok = await confirmAction(`Remove "${s.title || s.url}" and its ${count(s.chunks ?? 0, "passage")} from ${kb.name}?`, "Remove");
          if (!ok) return;
          const { removed_chunks: removed } = await host.request("source.remove", { kb: kb.id, source: s.id });
          flash(`Removed ${s.title || s.url} (${count(removed, "passage")}).`);
          await loadKnowledgeBases();
          const last = Math.max(0, total - 2);
          await openSources(kb, Math.min(offset, last - (last % SOURCES_PAGE)));
        }, "danger"),
      ),
    ),
  );
  if (!sources.length) $("sources-list").append(el("li", { class: "muted", text: "No sources." }));
  $("sources-page").textContent = total ? `${offset + 1}–${offset + sources.length} of ${total}` : "";
  /** @type {HTMLButtonElement} */ ($("sources-prev")).disabled = offset === 0;
  /** @type {HTMLButtonElement} */ ($("sources-next")).disabled = offset + sources.length >= total;
  $("sources-card").scrollIntoView({ block: "nearest" });
}

function closeSources() {
  state.sources = null;
  $("sources-card").hidden = true;
}

// ---- export and import ----

/** @param {any} kb */
async function exportKb(kb) {
  const passphrase = await askText({
    title: `Export ${kb.name}`,
    label: "Passphrase (optional)",
    hint: "With a passphrase the file is encrypted; without, anyone with the file can read it.",
    password: true,
    ok: "Export",
  });
  if (passphrase === null) return;
  flash(`Exporting ${kb.name}…`);
  /** @type {Record<string, string>} */
  const data = { kb: kb.id };
  if (passphrase) data.passphrase = passphrase;
  const result = await host.request("kb.export", data);
  const bytes = base64ToBytes(result.data_base64);
  const blob = new Blob([bytes], { type: "application/octet-stream" });
  const url = URL.createObjectURL(blob);
  try {
    await chrome.downloads.download({ url, filename: result.filename, saveAs: false, conflictAction: "uniquify" });
  } finally {
    // The download has its own copy once it started; revoke later so it can read the blob.
    setTimeout(() => URL.revokeObjectURL(url), 60_000);
  }
  flash(`Exported ${kb.name}: ${result.filename} (${formatBytes(result.bytes ?? bytes.length)}).`);
}

/**
 * Whether an import error means the file is encrypted and needs a passphrase.
 * @param {HostError} err
 */
function needsPassphrase(err) {
  return (
    err.code === "passphrase_required" ||
    err.detail?.code === "passphrase_required" ||
    err.detail?.reason === "passphrase_required"
  );
}

/**
 * Upload the file in parts and commit it as a new knowledge base.
 * @param {Uint8Array} bytes
 * @param {{name?: string, passphrase?: string}} options
 */
async function uploadAndCommit(bytes, options) {
  const progress = /** @type {HTMLProgressElement} */ ($("import-progress"));
  const parts = splitBytes(bytes, IMPORT_PART_BYTES);
  progress.hidden = false;
  progress.max = parts.length + 1;
  progress.value = 0;
  const { upload } = await host.request("kb.import", { action: "begin" });
  for (const [index, part] of parts.entries()) {
    await host.request("kb.import", { action: "part", upload, index, data_base64: bytesToBase64(part) });
    progress.value = index + 1;
  }
  /** @type {Record<string, unknown>} */
  const commit = { action: "commit", upload };
  if (options.name) commit.name = options.name;
  if (options.passphrase) commit.passphrase = options.passphrase;
  try {
    return await host.request("kb.import", commit);
  } finally {
    progress.hidden = true;
  }
}

async function importFile() {
  const input = /** @type {HTMLInputElement} */ ($("import-file"));
  const file = input.files?.[0];
  if (!file) return;
  const name = /** @type {HTMLInputElement} */ ($("import-name")).value.trim() || undefined;
  const bytes = new Uint8Array(await file.arrayBuffer());
  /** @type {string | undefined} */
  let passphrase;
  let result;
  for (;;) {
    try {
      result = await uploadAndCommit(bytes, { name, passphrase });
      break;
    } catch (err) {
      const e = /** @type {HostError} */ (err);
      const wrong = e.code === "decryption_failed" && passphrase !== undefined;
      if (!needsPassphrase(e) && !wrong) throw err;
      const answer = await askText({
        title: wrong ? "Wrong passphrase" : "This file is encrypted",
        label: "Passphrase",
        hint: wrong ? "That passphrase did not open the file. Try again." : `Enter the passphrase ${file.name} was exported with.`,
        password: true,
        required: true,
        ok: "Import",
      });
      if (answer === null) {
        flash("Import cancelled.");
        return;
      }
      passphrase = answer;
    }
  }
  const kb = result.knowledge_base;
  flash(`Imported ${kb?.name ?? "the knowledge base"}: ${count(result.sources, "source")}, ${count(result.chunks, "passage")}.`);
  /** @type {HTMLFormElement} */ ($("import-form")).reset();
  await loadKnowledgeBases();
}

// ---- endpoints ----

/** @type {string | null} */
let defaultEndpoint = null;

async function loadEndpoints() {
  const config = await host.request("config.get");
  defaultEndpoint = config.default_endpoint ?? null;
  const chosen = (config.endpoints ?? []).find((/** @type {any} */ e) => e.name === defaultEndpoint);
  const fact = [...$("host-facts").querySelectorAll("dt")].find((dt) => dt.textContent === "Default answer model");
  if (fact?.nextElementSibling) {
    fact.nextElementSibling.textContent = chosen
      ? `${chosen.name} · ${locationWords(chosen.location).text}`
      : "none (answers quote your passages)";
  }
  setChildren($("endpoints"), ...(config.endpoints ?? []).map((/** @type {any} */ e) => endpointRow(e)));
  if (!(config.endpoints ?? []).length) {
    $("endpoints").append(el("p", { class: "muted", id: "no-endpoints", text: "No endpoint yet." }));
    // Opened from the side panel's "Set up a model": a row to fill in, ready.
    if (location.hash === "#endpoints") {
      $("no-endpoints").remove();
      $("endpoints").append(endpointRow({}));
      $("endpoints-title").scrollIntoView();
    }
  }
  // Rows added before the list arrived would be wiped by it: adding waits for the list.
  /** @type {HTMLButtonElement} */ ($("add-endpoint")).disabled = false;
  $("endpoints").dataset.loaded = "true";
}

let endpointCounter = 0;

/** @param {any} e */
function endpointRow(e) {
  endpointCounter += 1;
  const n = endpointCounter;
  /**
   * @param {string} label
   * @param {string} key
   * @param {Record<string, any>} attrs
   */
  const field = (label, key, attrs) =>
    el("label", { class: "field" }, label, el("input", { name: key, ...attrs }));
  const where = el("span", { class: "pill muted" });
  const row = el(
    "fieldset",
    // The host says `api_key_set`; reading another name showed stored keys as "none" and
    // the next save sent api_key: null, deleting them.
    { class: "endpoint-row", dataset: { hasKey: String(Boolean(e.api_key_set)), savedUrl: e.base_url ?? "" } },
    el("legend", { class: "visually-hidden", text: `Endpoint ${e.name ?? n}` }),
    field("Name", "name", { type: "text", value: e.name ?? "", required: true, maxlength: 60 }),
    field("Base URL", "base_url", { type: "url", value: e.base_url ?? "", required: true, placeholder: "http://127.0.0.1:8080/v1" }),
    field("Model", "model", { type: "text", value: e.model ?? "" }),
    field("API key", "api_key", {
      type: "password",
      value: "",
      autocomplete: "off",
      placeholder: e.api_key_set ? "stored (leave empty to keep)" : "none",
    }),
    field("or API key from environment variable", "api_key_env", { type: "text", value: e.api_key_env ?? "", placeholder: "OPENAI_API_KEY" }),
    el(
      "div",
      { class: "ends" },
      el("label", { class: "check" }, el("input", { type: "checkbox", name: "mark_cloud", checked: Boolean(e.mark_cloud) }), "Treat as cloud"),
      el("label", { class: "check" }, el("input", { type: "radio", name: "default_endpoint", checked: e.name === defaultEndpoint && Boolean(e.name) }), "Default"),
      where,
      el("button", { type: "button", class: "small danger", text: "Remove", onclick: () => row.remove() }),
    ),
  );
  const keyHint = el("p", { class: "muted key-hint", hidden: true, text: "The stored key belongs to the old URL: a new URL drops it unless you enter the key again." });
  row.append(keyHint);
  /** @param {string | null | undefined} location */
  const show = (location) => {
    const words = locationWords(location);
    where.textContent = words.kind === "device" ? "on this device" : words.text;
    where.className = `pill ${words.kind}`;
    where.title = "Where the host says this endpoint runs (it decides from the address, not the name)";
  };
  let asked = 0;
  let timer = /** @type {ReturnType<typeof setTimeout> | undefined} */ (undefined);
  // The label is the host's verdict on the row as typed (config.check), never a rule of this page's.
  const update = () => {
    const base = /** @type {HTMLInputElement} */ (row.querySelector('[name="base_url"]')).value.trim();
    const cloud = /** @type {HTMLInputElement} */ (row.querySelector('[name="mark_cloud"]')).checked;
    keyHint.hidden = !(row.dataset.hasKey === "true" && base !== row.dataset.savedUrl);
    clearTimeout(timer);
    if (!base) {
      where.textContent = "no URL yet";
      where.className = "pill muted";
      return;
    }
    where.textContent = "checking…";
    where.className = "pill muted";
    const ticket = ++asked;
    timer = setTimeout(async () => {
      try {
        const { endpoint } = await host.request("config.check", { endpoint: { base_url: base, mark_cloud: cloud } });
        if (ticket === asked) show(endpoint.location);
      } catch (err) {
        if (ticket !== asked) return;
        where.textContent = `not usable: ${/** @type {Error} */ (err).message}`;
        where.className = "pill bad";
      }
    }, 250);
  };
  row.addEventListener("input", update);
  if (e.base_url) show(e.location);
  else update();
  addEndpointSetup(row, host); // presets, Test and the model picker (endpoints.js)
  row.dataset.where = "ready";
  return row;
}

async function saveEndpoints() {
  const endpoints = [];
  let chosen = null;
  for (const row of $("endpoints").querySelectorAll(".endpoint-row")) {
    const get = (/** @type {string} */ name) => /** @type {HTMLInputElement} */ (row.querySelector(`[name="${name}"]`));
    /** @type {Record<string, unknown>} */
    const entry = {
      name: get("name").value.trim(),
      base_url: get("base_url").value.trim(),
      model: get("model").value.trim(),
      api_key_env: get("api_key_env").value.trim() || null,
      mark_cloud: get("mark_cloud").checked,
    };
    // An empty key field keeps the stored key: the page never sees stored keys.
    const key = get("api_key").value;
    if (key) entry.api_key = key;
    else if (row.dataset.hasKey !== "true") entry.api_key = null;
    if (get("default_endpoint").checked) chosen = entry.name;
    endpoints.push(entry);
  }
  await host.request("config.set", { endpoints, default_endpoint: chosen ?? endpoints[0]?.name ?? null });
  flash(`Saved ${endpoints.length} endpoint${endpoints.length === 1 ? "" : "s"}.`);
  chrome.runtime.sendMessage({ type: "endpoints-changed" }).catch(() => {}); // an open side panel reloads them
  await loadEndpoints();
}

// ---- wiring ----

$("create-kb").addEventListener("submit", (/** @type {Event} */ e) => {
  e.preventDefault();
  guarded(async () => {
    const name = /** @type {HTMLInputElement} */ ($("new-kb-name")).value.trim();
    const privacy = /** @type {HTMLSelectElement} */ ($("new-kb-privacy")).value;
    if (!name) return;
    const { knowledge_base: kb } = await host.request("kb.create", { name, privacy });
    /** @type {HTMLFormElement} */ ($("create-kb")).reset();
    flash(`Created ${kb.name} (${privacyLabel(kb.privacy)}).`);
    await loadKnowledgeBases();
  });
});
$("import-form").addEventListener("submit", (/** @type {Event} */ e) => {
  e.preventDefault();
  guarded(importFile);
});
$("endpoints-form").addEventListener("submit", (/** @type {Event} */ e) => {
  e.preventDefault();
  guarded(saveEndpoints);
});
$("add-endpoint").addEventListener("click", () => {
  $("no-endpoints")?.remove();
  $("endpoints").append(endpointRow({}));
});
$("errors-refresh").addEventListener("click", () => guarded(loadErrors));
$("sources-close").addEventListener("click", closeSources);
$("sources-prev").addEventListener("click", () =>
  guarded(async () => state.sources && openSources(state.sources.kb, Math.max(0, state.sources.offset - SOURCES_PAGE))),
);
$("sources-next").addEventListener("click", () =>
  guarded(async () => state.sources && openSources(state.sources.kb, state.sources.offset + SOURCES_PAGE)),
);

connect();
