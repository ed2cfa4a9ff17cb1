/* The sessions list, the open session's heading (title, status, budget), and opening,
 * creating and deleting sessions. */

import { $, ago, el, formatSeconds, shortId, state, toast } from "./page.js";
import { api, sessionPath } from "./api.js";
import { setStatusBadge, showBusy } from "./status.js";
import { connectWatch, showTransfer } from "./watch.js";
import { filesSessionSeen, refreshFiles, unwatchFiles, watchFiles } from "./files.js";
import { closeTerminal, setTabLinks, showTab } from "./terminal.js";
import { loadLanguages } from "./cells.js";
import { refreshApprovals } from "./approvals.js";
import { profileLabel, templateOf } from "./templates.js";

// -- sessions ----------------------------------------------------------------------------

export async function refreshSessions() {
  const [sessions] = await Promise.all([api("GET", "/v1/sessions"), refreshApprovals()]);
  renderSessions(sessions);
}

export function renderSessions(sessions) {
  sessions.sort((a, b) => b.created_at.localeCompare(a.created_at));
  state.sessions = sessions;
  $("tenant").textContent = sessions.length ? `tenant ${sessions[0].tenant}` : "";
  const list = $("session-list");
  list.replaceChildren(...sessions.map(sessionItem));
  $("sessions-empty").hidden = sessions.length > 0;
  const current = sessions.find((s) => s.id === state.current);
  if (current) {
    showSessionTitle(current.id, current);
    setStatusBadge($("session-status"), current.status);
    renderBudget(current.budget);
    // Opened while a pause or resume runs: the bar shows before its next frame comes.
    if (current.transfer && $("transfer").hidden) {
      showTransfer({ ...current.transfer, state: "running" });
    }
    filesSessionSeen(current);
  }
  showBusy();
}

const BUDGET_ITEMS = [
  ["executions_left", (n) => (n === 1 ? "1 run" : `${n} runs`), "executions"],
  ["wall_time_left_s", (s) => `${formatSeconds(s)} wall time`, "wall time"],
  ["cpu_time_left_s", (s) => `${formatSeconds(s)} CPU time`, "CPU time"],
  ["lifetime_left_s", (s) => `${formatSeconds(s)} lifetime`, "lifetime"],
];

/** The open session's budget left, when its policy gives it one. */
function renderBudget(budget) {
  const node = $("budget");
  const items = [];
  for (const [name, format, label] of BUDGET_ITEMS) {
    const value = budget ? budget[name] : null;
    if (typeof value !== "number" || !Number.isFinite(value)) continue;
    const low = name === "executions_left" ? value <= 3 : value < 60;
    items.push(el("span", {
      class: `budget-item${value <= 0 ? " spent" : low ? " low" : ""}`,
      "data-budget": name, title: `${label} left in this session's budget`,
    }, format(value)));
  }
  node.replaceChildren(...(items.length
    ? [el("span", { class: "budget-label", text: "Budget left" }), ...items] : []));
  node.hidden = items.length === 0;
}

/** The name the session's metadata gives it (`metadata.name`), or null. */
function sessionName(session) {
  const name = session && session.metadata ? session.metadata.name : null;
  return typeof name === "string" && name.trim() ? name.trim() : null;
}

/** The rest of the session's metadata as "key: value" texts (values as JSON unless text). */
function metadataTexts(session) {
  return Object.entries(session.metadata || {})
    .filter(([key]) => !(key === "name" && sessionName(session)))
    .map(([key, value]) => `${key}: ${typeof value === "string" ? value : JSON.stringify(value)}`);
}

function showSessionTitle(id, session) {
  const name = sessionName(session);
  const title = $("session-title");
  title.textContent = name || `Session ${shortId(id)}`;
  title.classList.toggle("named", Boolean(name));
  title.title = id;
  // Which template (or profile) the sandbox runs: a template's profile is its id and build.
  const profile = session ? session.profile : null;
  $("session-profile").textContent = profile ? profileLabel(profile) : "";
  $("session-profile").title = profile || "";
}

function sessionItem(session) {
  const runs = session.execution_count === 1 ? "1 run" : `${session.execution_count} runs`;
  const name = sessionName(session);
  const metadata = metadataTexts(session);
  const remove = el("button", {
    class: "icon-button delete", type: "button", title: "Delete session",
    "aria-label": `Delete session ${name || shortId(session.id)}`, text: "×",
  });
  remove.addEventListener("click", (event) => {
    event.stopPropagation();
    confirmThen(remove, () => deleteSession(session.id, name || shortId(session.id)));
  });
  const item = el("li", {
    class: `session-item${session.id === state.current ? " active" : ""}`,
    "data-session-id": session.id, tabindex: 0, role: "button",
  },
  el("div", { class: "session-line" },
    name ? el("span", { class: "session-name", text: name, title: name })
      : el("span", { class: "session-name mono", text: shortId(session.id) }),
    statusBadge(session.status),
    state.waiting.get(session.id) ? el("span", {
      class: "badge badge-pending_approval waiting",
      title: "Cells of this session wait for a person's approval",
      text: state.waiting.get(session.id) === 1 ? "needs approval"
        : `${state.waiting.get(session.id)} need approval`,
    }) : null),
  el("div", { class: "session-sub muted" },
    `${templateOf(session.profile)?.name || session.profile} · ${runs} · ${
      ago(session.created_at)}`),
  // A named session's id (its prefix) goes here, with the rest of its metadata.
  name || metadata.length ? el("div", { class: "session-meta muted", title: metadata.join("\n") || null },
    name ? el("span", { class: "mono", text: shortId(session.id) }) : null,
    `${name && metadata.length ? " · " : ""}${metadata.join(" · ")}`) : null,
  remove);
  item.addEventListener("click", () => { location.hash = `#/s/${session.id}`; });
  item.addEventListener("keydown", (event) => {
    if (event.key === "Enter") location.hash = `#/s/${session.id}`;
  });
  return item;
}

function confirmThen(button, action) {
  if (button.dataset.armed) {
    delete button.dataset.armed;
    action();
    return;
  }
  button.dataset.armed = "1";
  button.textContent = "Delete?";
  button.classList.add("armed");
  setTimeout(() => {
    if (!button.isConnected) return;
    delete button.dataset.armed;
    button.textContent = "×";
    button.classList.remove("armed");
  }, 3000);
}

function statusBadge(status) {
  return setStatusBadge(el("span"), status);
}

export async function createSession() {
  const button = $("new-session");
  button.disabled = true;
  try {
    // A ready template's name chosen in the picker, else the default profile.
    const profile = $("new-profile").value;
    const session = await api("POST", "/v1/sessions", { json: profile ? { profile } : {} });
    await refreshSessions();
    location.hash = `#/s/${session.id}`;
  } catch (error) {
    if (error.status !== 401) toast(`Could not create a session: ${error.message}`, "error");
  } finally {
    button.disabled = false;
  }
}

async function deleteSession(id, label) {
  try {
    await api("DELETE", sessionPath(id));
    toast(`Deleted session ${label}`);
  } catch (error) {
    if (error.status !== 401 && error.status !== 404) {
      toast(`Could not delete: ${error.message}`, "error");
    }
  }
  if (id === state.current) location.hash = "";
  await refreshSessions().catch(() => {});
}

export function openFromHash() {
  if (!state.key) return;
  // `#/s/<id>` opens a session's notebook, `#/s/<id>/terminal` its terminal, `/network` its
  // network policy.
  const match = /^#\/s\/([A-Za-z0-9_-]+)(?:\/(terminal|network))?$/.exec(location.hash);
  const id = match ? match[1] : null;
  if (id !== state.current) {
    closeSession();
    if (id) openSession(id);
  }
  if (id) showTab(match[2] || "notebook");
}

function openSession(id) {
  state.current = id;
  $("welcome").hidden = true;
  $("session-view").hidden = false;
  $("files-panel").hidden = false;
  const known = state.sessions.find((s) => s.id === id);
  showSessionTitle(id, known);
  setStatusBadge($("session-status"), known ? known.status : "idle");
  renderBudget(known ? known.budget : null);
  for (const item of document.querySelectorAll(".session-item")) {
    item.classList.toggle("active", item.dataset.sessionId === id);
  }
  setTabLinks(id);
  connectWatch();
  refreshFiles();
  watchFiles(known);
  loadLanguages(known ? known.profile : "default");
}

export function closeSession() {
  state.current = null;
  closeTerminal();
  unwatchFiles();
  clearTimeout(state.retryTimer);
  for (const socket of [state.watch, state.runner]) {
    if (socket) { socket.onclose = null; socket.close(); }
  }
  state.watch = null;
  state.runner = null;
  state.runnerQueue = [];
  clearTimeout(state.transferTimer);
  $("transfer").hidden = true;
  state.cells.clear();
  state.displays.clear();
  for (const cell of document.querySelectorAll("#transcript .cell")) cell.remove();
  $("transcript-empty").hidden = false;
  $("session-view").hidden = true;
  $("budget").hidden = true;
  $("files-panel").hidden = true;
  $("welcome").hidden = false;
  for (const item of document.querySelectorAll(".session-item.active")) {
    item.classList.remove("active");
  }
}
