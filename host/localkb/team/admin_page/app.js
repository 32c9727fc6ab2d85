// The team server's administrators' page: users and their roles, roles with their clearance
// and grants, tokens, knowledge bases (privacy, default level) and source levels. The token is
// kept in sessionStorage and sent as a bearer header (never a cookie); text from the server is
// only ever set as textContent.

import { el } from "/pipeline/dom.js";

const $ = (sel) => document.querySelector(sel);
const state = { token: sessionStorage.getItem("localkb-admin-token") || "", levels: [], roles: [], kbs: [] };

async function api(path, options = {}) {
  const resp = await fetch(path, {
    ...options,
    headers: { Authorization: `Bearer ${state.token}`, "Content-Type": "application/json" },
    body: options.body === undefined ? undefined : JSON.stringify(options.body),
  });
  const body = await resp.json();
  if (!body.ok) throw Object.assign(new Error(body.error.message), { code: body.error.code });
  return body.result;
}

function flash(text, bad = false) {
  const node = $("#flash");
  node.textContent = text;
  node.className = bad ? "flash bad" : "flash";
  node.hidden = false;
}

/** Run an action; its error is shown, never lost. */
async function act(fn, done) {
  try {
    await fn();
    if (done) flash(done);
    await load();
  } catch (err) {
    flash(err.message, true);
  }
}

function options(select, values, chosen, empty) {
  select.replaceChildren(...(empty ? [el("option", { value: "", text: empty })] : []),
    ...values.map(([value, text]) => el("option", { value, text, selected: value === chosen })));
}

async function signIn(token) {
  state.token = token.trim();
  try {
    const me = await api("/v1/me");
    if (!me.admin && !me.is_admin) {
      $("#who").textContent = `${me.user} is not an administrator of this team: this page needs an administrator's token.`;
      $("#app").hidden = true;
      return;
    }
    sessionStorage.setItem("localkb-admin-token", state.token);
    $("#who").textContent = `Signed in as ${me.user} (administrator)`;
    $("#sign-out").hidden = false;
    $("#app").hidden = false;
    await load();
  } catch (err) {
    $("#who").textContent = `Not signed in: ${err.message}`;
    $("#app").hidden = true;
  }
}

async function load() {
  const [{ users, levels }, { roles }, kbs] = await Promise.all([
    api("/v1/admin/users"), api("/v1/admin/roles"), api("/v1/kbs"),
  ]);
  state.levels = levels;
  state.roles = roles;
  state.kbs = kbs.knowledge_bases;
  for (const s of document.querySelectorAll(".role-select")) options(s, roles.map((r) => [r.name, r.name]), s.value, s.closest("#user-add") ? "no role" : null);
  for (const s of document.querySelectorAll(".level-select")) options(s, levels.map((l) => [l, l]), s.value || levels[1]);
  for (const s of document.querySelectorAll(".kb-select")) options(s, state.kbs.map((k) => [k.id, k.name]), s.value);
  renderUsers(users);
  renderRoles(roles);
  renderKbs(state.kbs);
}

function renderUsers(users) {
  $("#users").replaceChildren(...users.map((u) => {
    const missing = state.roles.filter((r) => !u.roles.includes(r.name));
    const addRole = el("select", { "aria-label": `Role to give ${u.name}` });
    options(addRole, missing.map((r) => [r.name, r.name]), "", "give a role…");
    addRole.addEventListener("change", () => addRole.value && act(() => api(`/v1/admin/users/${encodeURIComponent(u.name)}`, { method: "PATCH", body: { add_roles: [addRole.value] } }), `${u.name} has the role ${addRole.value} now.`));
    const live = (u.tokens ?? []).filter((t) => !t.revoked);
    return el("tr", { "data-user": u.name },
      el("th", { scope: "row", text: u.admin ? `${u.name} (administrator)` : u.name }),
      el("td", {}, ...u.roles.map((r) => el("span", { class: "chip" }, r,
        el("button", { type: "button", "aria-label": `Take the role ${r} from ${u.name}`, text: "×",
          onclick: () => act(() => api(`/v1/admin/users/${encodeURIComponent(u.name)}`, { method: "PATCH", body: { remove_roles: [r] } }), `${u.name} no longer has the role ${r}.`) }))),
        missing.length ? addRole : null),
      el("td", {}, ...live.map((t) => el("span", { class: "chip" }, `${t.name} · ${t.id}`,
        el("button", { type: "button", "aria-label": `Revoke token ${t.id} of ${u.name}`, text: "×",
          onclick: () => act(() => api(`/v1/admin/tokens/${encodeURIComponent(t.id)}`, { method: "DELETE" }), `Token ${t.id} revoked: refused from its next request.`) }))),
        live.length ? null : el("span", { class: "muted", text: "none" })),
      el("td", {}, el("div", { class: "actions" },
        el("button", { type: "button", text: "New token", onclick: () => newToken(u.name) }),
        el("button", { type: "button", class: "danger", text: "Remove", "aria-label": `Remove ${u.name}`,
          onclick: () => confirm(`Remove ${u.name} and their tokens?`) && act(() => api(`/v1/admin/users/${encodeURIComponent(u.name)}`, { method: "DELETE" }), `${u.name} removed.`) }))));
  }));
}

async function newToken(user) {
  try {
    const made = await api("/v1/admin/tokens", { method: "POST", body: { user, name: "admin page" } });
    $("#token-user").textContent = user;
    $("#token-value").textContent = made.token;
    $("#token-shown").hidden = false;
    await load();
  } catch (err) {
    flash(err.message, true);
  }
}

function renderRoles(roles) {
  $("#roles").replaceChildren(...roles.map((r) => {
    const level = el("select", { "aria-label": `Clearance of ${r.name}` });
    options(level, state.levels.map((l) => [l, l]), r.clearance);
    level.addEventListener("change", () => act(() => api(`/v1/admin/roles/${encodeURIComponent(r.name)}`, { method: "PATCH", body: { clearance: level.value } }), `${r.name} now has clearance ${level.value}.`));
    return el("tr", { "data-role": r.name },
      el("th", { scope: "row", text: r.name }),
      el("td", {}, level),
      el("td", {}, ...r.grants.map((g) => el("span", { class: "chip" }, `${g.kb_name}${g.write ? " · writes" : ""}`,
        el("button", { type: "button", "aria-label": `Revoke ${r.name}'s grant on ${g.kb_name}`, text: "×",
          onclick: () => act(() => api("/v1/admin/grants/revoke", { method: "POST", body: { role: r.name, kb: g.kb } }), `${r.name} no longer reads ${g.kb_name}.`) }))),
        r.grants.length ? null : el("span", { class: "muted", text: "none" })),
      el("td", {}, el("button", { type: "button", class: "danger", text: "Remove", "aria-label": `Remove role ${r.name}`,
        onclick: () => confirm(`Remove the role ${r.name}?`) && act(() => api(`/v1/admin/roles/${encodeURIComponent(r.name)}`, { method: "DELETE" }), `Role ${r.name} removed.`) })));
  }));
}

function renderKbs(kbs) {
  $("#kbs").replaceChildren(...kbs.map((k) => {
    const privacy = el("select", { "aria-label": `Privacy of ${k.name}` });
    options(privacy, [["device", "device only"], ["cloud", "may reach a cloud model"]], k.privacy);
    privacy.addEventListener("change", () => act(() => api(`/v1/kbs/${encodeURIComponent(k.id)}`, { method: "PATCH", body: { privacy: privacy.value } }), `${k.name} is now ${privacy.value === "cloud" ? "allowed to reach a cloud model" : "device only"}.`));
    const level = el("select", { "aria-label": `Level of new sources in ${k.name}` });
    options(level, state.levels.map((l) => [l, l]), k.default_access ?? k.access?.default ?? state.levels[0]);
    level.addEventListener("change", () => act(() => api(`/v1/kbs/${encodeURIComponent(k.id)}`, { method: "PATCH", body: { default_access: level.value } }), `New sources in ${k.name} are ${level.value}.`));
    return el("tr", { "data-kb": k.name },
      el("th", { scope: "row", text: k.name }),
      el("td", {}, privacy),
      el("td", {}, level),
      el("td", {}, el("button", { type: "button", text: `${k.sources ?? 0} sources`, "aria-label": `Show the sources of ${k.name}`, onclick: () => showSources(k) })));
  }));
}

async function showSources(kb) {
  try {
    const { sources } = await api(`/v1/kbs/${encodeURIComponent(kb.id)}/sources?limit=500`);
    $("#sources-h").textContent = `Sources of ${kb.name}`;
    $("#sources").replaceChildren(...sources.map((s) => {
      const level = el("select", { "aria-label": `Level of ${s.title || s.url || s.id}` });
      options(level, state.levels.map((l) => [l, l]), s.access);
      level.addEventListener("change", () => act(async () => {
        await api(`/v1/kbs/${encodeURIComponent(kb.id)}/sources/${encodeURIComponent(s.id)}`, { method: "PATCH", body: { access: level.value } });
        await showSources(kb);
      }, `${s.title || s.id} is now ${level.value}.`));
      return el("tr", {}, el("th", { scope: "row", text: s.title || s.url || s.id }), el("td", {}, level));
    }));
    $("#sources-wrap").hidden = false;
  } catch (err) {
    flash(err.message, true);
  }
}

function formData(form) {
  return Object.fromEntries([...new FormData(form).entries()]);
}

$("#token-form").addEventListener("submit", (e) => {
  e.preventDefault();
  signIn($("#token").value);
});
$("#sign-out").addEventListener("click", () => {
  sessionStorage.removeItem("localkb-admin-token");
  state.token = "";
  $("#app").hidden = true;
  $("#sign-out").hidden = true;
  $("#who").textContent = "Signed out.";
});
$("#user-add").addEventListener("submit", (e) => {
  e.preventDefault();
  const f = formData(e.target);
  act(() => api("/v1/admin/users", { method: "POST", body: { name: f.name, admin: Boolean(f.admin), roles: f.role ? [f.role] : [] } }), `${f.name} added.`)
    .then(() => e.target.reset());
});
$("#role-add").addEventListener("submit", (e) => {
  e.preventDefault();
  const f = formData(e.target);
  act(() => api("/v1/admin/roles", { method: "POST", body: { name: f.name, clearance: f.clearance } }), `Role ${f.name} added.`)
    .then(() => e.target.reset());
});
$("#grant").addEventListener("submit", (e) => {
  e.preventDefault();
  const f = formData(e.target);
  const kb = state.kbs.find((k) => k.id === f.kb);
  act(() => api("/v1/admin/grants", { method: "POST", body: { role: f.role, kb: f.kb, write: Boolean(f.write) } }), `${f.role} may read${f.write ? " and write" : ""} ${kb?.name ?? f.kb} now.`);
});

fetch("/v1/health").then((r) => r.json()).then((h) => {
  $("#team-name").textContent = h.result ? `· ${h.result.name}` : "";
}).catch(() => {});
if (state.token) signIn(state.token);
