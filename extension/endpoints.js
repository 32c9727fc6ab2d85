// Setting up a model endpoint on the options page the way a peer's settings do it: a
// preset for the usual local servers, a Test button, and the server's own model list in a
// picker. The page never contacts the server: the host does (`endpoint.test`), so the
// answer, its model list and where the server runs are all the host's verdict.

import { el } from "./dom.js";

/** The servers people run most, with their default addresses; "custom" is any other. */
export const PRESETS = Object.freeze([
  { id: "ollama", label: "Ollama", name: "ollama", base_url: "http://127.0.0.1:11434/v1" },
  { id: "lmstudio", label: "LM Studio", name: "lm-studio", base_url: "http://127.0.0.1:1234/v1" },
  { id: "llamacpp", label: "llama.cpp server", name: "llama-cpp", base_url: "http://127.0.0.1:8080/v1" },
  { id: "custom", label: "Custom URL", name: "custom", base_url: "" },
]);

/**
 * The preset a base URL is, or "custom".
 * @param {string} url
 */
export function presetOf(url) {
  const clean = url.trim().replace(/\/+$/, "");
  return PRESETS.find((p) => p.base_url && p.base_url === clean)?.id ?? "custom";
}

/**
 * The line a test result reads as: "answers · 1 model · on this device", or why not.
 * @param {{ok: boolean, models: string[], location: string | null, error: {message: string} | null}} result
 */
export function testLine(result) {
  if (!result.ok) return `does not answer: ${result.error?.message ?? "no reason given"}`;
  const n = result.models.length;
  const where = result.location === "device"
    ? "on this device"
    : result.location === "cloud" ? "in the cloud" : "location unknown (treated as cloud)";
  return `answers · ${n} model${n === 1 ? "" : "s"} · ${where}`;
}

/**
 * Add the preset picker, the Test button and the model picker to one endpoint row.
 * @param {HTMLElement} row the row's fieldset (with inputs named name, base_url, model, api_key, ...)
 * @param {{request: (type: string, data?: any) => Promise<any>}} host
 */
export function addEndpointSetup(row, host) {
  const input = (/** @type {string} */ name) => /** @type {HTMLInputElement} */ (row.querySelector(`[name="${name}"]`));
  const preset = /** @type {HTMLSelectElement} */ (el(
    "select",
    { name: "preset" },
    ...PRESETS.map((p) => el("option", { value: p.id, text: p.label })),
  ));
  preset.value = presetOf(input("base_url").value);
  preset.addEventListener("change", () => {
    const chosen = PRESETS.find((p) => p.id === preset.value);
    if (!chosen) return;
    const name = input("name");
    if (!name.value.trim() || PRESETS.some((p) => p.name === name.value.trim())) name.value = chosen.name;
    const url = input("base_url");
    if (chosen.base_url) url.value = chosen.base_url;
    else if (presetOf(url.value) !== "custom") url.value = "";
    url.dispatchEvent(new Event("input", { bubbles: true })); // the row's own location check
    if (!chosen.base_url) url.focus();
  });
  input("base_url").addEventListener("input", () => {
    if (document.activeElement === input("base_url")) preset.value = presetOf(input("base_url").value);
  });

  const test = el("button", { type: "button", class: "small", name: "test", text: "Test" });
  const line = el("span", { class: "test-line muted", role: "status", "aria-live": "polite" });
  const picker = /** @type {HTMLSelectElement} */ (el("select", { name: "model_pick" }));
  const pickerField = el("label", { class: "check model-pick", hidden: true }, "Models it lists", picker);
  picker.addEventListener("change", () => {
    input("model").value = picker.value;
  });
  test.addEventListener("click", async () => {
    const base = input("base_url").value.trim();
    if (!base) {
      line.textContent = "Enter the server's base URL first.";
      line.className = "test-line bad";
      return;
    }
    /** @type {Record<string, unknown>} */
    const data = { base_url: base, mark_cloud: input("mark_cloud").checked };
    if (input("name").value.trim()) data.name = input("name").value.trim(); // its stored key, if the URL is the same
    if (input("api_key").value) data.api_key = input("api_key").value;
    if (input("api_key_env").value.trim()) data.api_key_env = input("api_key_env").value.trim();
    test.disabled = true;
    line.textContent = "testing…";
    line.className = "test-line muted";
    try {
      const result = await host.request("endpoint.test", data);
      line.textContent = testLine(result);
      line.className = `test-line ${result.ok ? "ok" : "bad"}`;
      row.dataset.test = result.ok ? "ok" : "failed";
      pickerField.hidden = !result.models.length;
      picker.replaceChildren(...result.models.map((/** @type {string} */ m) => el("option", { value: m, text: m })));
      const model = input("model");
      if (result.models.length && !result.models.includes(model.value.trim())) model.value = result.models[0];
      if (result.models.includes(model.value.trim())) picker.value = model.value.trim();
    } catch (err) {
      line.textContent = `could not test: ${/** @type {Error} */ (err).message}`;
      line.className = "test-line bad";
      row.dataset.test = "failed";
    } finally {
      test.disabled = false;
    }
  });

  const legend = row.querySelector("legend");
  const presetField = el("label", { class: "field" }, "Server", preset);
  if (legend) legend.after(presetField);
  else row.prepend(presetField);
  row.querySelector(".ends")?.before(el("div", { class: "test-row" }, test, line, pickerField));
}
