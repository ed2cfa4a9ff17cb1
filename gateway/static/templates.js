/* The Templates panel: the tenant's custom templates (docs/templates.md) with their status,
 * size and error, a selected one's build log (followed over the log WebSocket while it builds,
 * read whole once it has ended), and the ready ones offered to "New session".
 *
 * A build log and an error are the build's output: they go into the DOM as text only.
 */

import { $, el, state, toast } from "./page.js";
import { api, socketUrl } from "./api.js";

const POLL_MS = 3000;  // the list again while a build runs, for its status and size

let templates = [];
let selected = null;   // id of the template whose log shows
let follow = null;     // the log WebSocket of the selected template, while it builds
let pollTimer = null;
let asked = 0;         // the latest list request's number: a late older answer is dropped

export const templateUrl = (id) => `/v1/templates/${encodeURIComponent(id)}`;

/** Load and show the tenant's templates; polls while one builds. */
export async function refreshTemplates() {
  const mine = ++asked;
  clearTimeout(pollTimer);
  let listed;
  try {
    listed = await api("GET", "/v1/templates");
  } catch (error) {
    if (error.status !== 401) $("templates-error").textContent = `Could not list templates: ${error.message}`;
    return;
  }
  if (mine !== asked || !state.key) return;
  $("templates-error").textContent = "";
  templates = listed;
  renderTemplates();
  if (templates.some((t) => t.status === "building")) {
    pollTimer = setTimeout(() => refreshTemplates().catch(() => {}), POLL_MS);
  }
}

/** The template a session's profile is a build of (its id and build number), or null. */
export function templateOf(profile) {
  return templates.find((t) => t.profile === profile || profile.startsWith(`${t.id}-`)) || null;
}

/** The label a session's profile shows: its template's name when it is one. */
export function profileLabel(profile) {
  const template = templateOf(profile);
  return template ? `template ${template.name}` : `profile ${profile}`;
}

/** Stop following a log and polling (on sign-out). */
export function closeTemplates() {
  clearTimeout(pollTimer);
  asked += 1;  // an answer still on its way is the previous key's
  templates = [];
  renderTemplates();
}

function renderTemplates() {
  $("template-list").replaceChildren(...templates.map(templateItem));
  $("templates-empty").hidden = templates.length > 0;
  renderChoices();
  const shown = templates.find((t) => t.id === selected);
  if (selected && !shown) showLog(null);
  else if (shown && !follow && shown.status !== "building" && !$("template-log").dataset.whole) {
    showLog(shown);  // its build ended between two lists: read the log whole
  }
}

function renderChoices() {
  const picker = $("new-profile");
  const before = picker.value;
  const ready = templates.filter((t) => t.status === "ready");
  picker.replaceChildren(el("option", { value: "", text: "default profile" }),
    ...ready.map((t) => el("option", { value: t.name, text: `template ${t.name}` })));
  picker.value = ready.some((t) => t.name === before) ? before : "";
  picker.hidden = ready.length === 0;
}

function formatBytes(bytes) {
  if (typeof bytes !== "number") return "";
  if (bytes < 1e6) return `${Math.max(1, Math.round(bytes / 1e3))} kB`;
  if (bytes < 1e9) return `${(bytes / 1e6).toFixed(1)} MB`;
  return `${(bytes / 1e9).toFixed(2)} GB`;
}

function templateItem(template) {
  const item = el("li", {
    class: `template-item${template.id === selected ? " active" : ""}`,
    "data-template-id": template.id, "data-status": template.status, tabindex: 0, role: "button",
    title: `Show the build log of ${template.name}`,
  },
  el("div", { class: "session-line" },
    el("span", { class: "session-name template-name", text: template.name }),
    el("span", { class: `badge badge-template-${template.status}`, text: template.status })),
  el("div", { class: "session-sub muted" }, [template.public ? "public" : null,
    formatBytes(template.image_size), `build ${template.builds}`].filter(Boolean).join(" · ")),
  template.error ? el("div", { class: "template-error", text: template.error }) : null);
  const open = () => showLog(template);
  item.addEventListener("click", open);
  item.addEventListener("keydown", (event) => { if (event.key === "Enter") open(); });
  return item;
}

function closeFollow() {
  if (follow) { follow.onclose = null; follow.close(); }
  follow = null;
}

/** Show a template's build log: followed live while it builds, else read whole. */
async function showLog(template) {
  closeFollow();
  selected = template ? template.id : null;
  for (const item of document.querySelectorAll(".template-item")) {
    item.classList.toggle("active", item.dataset.templateId === selected);
  }
  const log = $("template-log");
  log.replaceChildren();
  delete log.dataset.whole;
  $("template-log-box").hidden = !template;
  if (!template) return;
  $("template-log-title").textContent = `Build log of ${template.name}`;
  if (template.status === "building") return followLog(template.id);
  try {
    const lines = await api("GET", `${templateUrl(template.id)}/logs`);
    if (selected !== template.id) return;
    log.replaceChildren(...lines.map(logLine));
    log.dataset.whole = "1";
    log.scrollTop = log.scrollHeight;
  } catch (error) {
    if (error.status !== 401) toast(`Could not read the build log: ${error.message}`, "error");
  }
}

function logLine(line) {
  return el("div", { class: `log-line${line.error ? " error" : ""}`, text: line.text });
}

function followLog(id) {
  const log = $("template-log");
  log.dataset.live = "1";
  const socket = new WebSocket(socketUrl(`${templateUrl(id)}/logs/ws`));
  follow = socket;
  socket.onmessage = (event) => {
    const frame = JSON.parse(event.data);
    if (frame.type === "end") {
      delete log.dataset.live;
      log.dataset.whole = "1";
      follow = null;
      refreshTemplates().catch(() => {});
      return;
    }
    const atEnd = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
    log.append(logLine(frame));
    if (atEnd) log.scrollTop = log.scrollHeight;
  };
  socket.onclose = () => {
    if (follow !== socket) return;
    follow = null;
    delete log.dataset.live;
    refreshTemplates().catch(() => {});  // the list reads the log whole once the build ended
  };
}
