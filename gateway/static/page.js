/* The page's state and the small helpers every view uses: DOM building, formatting, toasts,
 * downloads and the transcript's scrolling. */

export const $ = (id) => document.getElementById(id);
export const state = {
  key: null,
  approverKey: null,   // a person's key of REPLGATE_APPROVER_KEYS, to decide approvals
  sessions: [],
  waiting: new Map(),  // session id -> how many of its executions wait for approval
  current: null,        // id of the open session
  watch: null,          // the open session's watch socket
  runner: null,         // the open session's ws socket (runs code)
  runnerQueue: [],
  retry: 0,
  retryTimer: null,
  cells: new Map(),     // execution id -> cell
  displays: new Map(),  // display id -> [output element]
  pollTimer: null,
  approvalsAsked: 0,   // sequence number of the latest GET /v1/approvals
  refreshTimer: null,
  transferTimer: null,  // hides the pause/resume bar a moment after its transfer ended
  kernelspecs: null,    // GET /api/kernelspecs, once: the languages of each profile
  terminal: null,       // the open session's terminal tab: its xterm and socket
  filesWatch: null,     // the open session's files watch: its socket, retries, pending refresh
};

// What a view calls of the views above it (signing out on a refused key, refreshing the
// sessions list): app.js sets these at start, so no module imports one that imports it.
export const hooks = {
  signOut: null,          // (message) => void: signin.js's signOut
  refreshSessions: null,  // () => Promise: sessions.js's refreshSessions
};

// -- small helpers -----------------------------------------------------------------------

export function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "class") node.className = value;
    else if (name === "text") node.textContent = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

export function randomId() {
  const bytes = new Uint8Array(16);
  crypto.getRandomValues(bytes);
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

export function shortId(id) { return id.slice(0, 8); }

export function formatDuration(ms) {
  if (ms === null || ms === undefined) return "";
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(ms < 10000 ? 2 : 1)} s`;
  const minutes = Math.floor(ms / 60000);
  return `${minutes} min ${Math.round((ms % 60000) / 1000)} s`;
}

export function formatSeconds(seconds) {
  const s = Math.max(0, seconds);
  if (s < 10) return `${Number(s.toFixed(1))} s`;
  if (s < 60) return `${Math.floor(s)} s`;
  if (s < 600) return `${Math.floor(s / 60)} min ${Math.floor(s % 60)} s`;
  if (s < 3600) return `${Math.round(s / 60)} min`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
  return `${Math.floor(s / 86400)} d ${Math.floor((s % 86400) / 3600)} h`;
}

export function clockTime(iso) {
  const date = new Date(iso);
  if (Number.isNaN(date.getTime())) return "";
  return date.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" });
}

export function formatSize(bytes) {
  if (bytes < 1024) return `${bytes} B`;
  const units = ["KB", "MB", "GB"];
  let value = bytes / 1024;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) { value /= 1024; unit += 1; }
  return `${value.toFixed(value < 10 ? 1 : 0)} ${units[unit]}`;
}

export function ago(iso) {
  const seconds = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
  if (!Number.isFinite(seconds)) return "";
  if (seconds < 60) return "just now";
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min ago`;
  if (seconds < 86400) return `${Math.floor(seconds / 3600)} h ago`;
  return `${Math.floor(seconds / 86400)} d ago`;
}

const TOASTS_SHOWN = 3;

export function toast(message, kind = "info") {
  const node = el("div", { class: `toast toast-${kind}`, text: message, title: message });
  const toasts = $("toasts");
  toasts.append(node);
  // The top bar has room for a few: the oldest go first.
  while (toasts.children.length > TOASTS_SHOWN) toasts.firstElementChild.remove();
  setTimeout(() => node.classList.add("leaving"), 4000);
  setTimeout(() => node.remove(), 4400);
}

export function saveBlob(blob, filename) {
  const url = URL.createObjectURL(blob);
  const link = el("a", { href: url, download: filename });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}

// -- layout ------------------------------------------------------------------------------

export function isNearBottom() {
  const t = $("transcript");
  return t.scrollHeight - t.scrollTop - t.clientHeight < 120;
}

export function scrollToEnd(force) {
  const t = $("transcript");
  if (force || isNearBottom()) t.scrollTop = t.scrollHeight;
}

export function autosize() {
  const textarea = $("code");
  textarea.style.height = "auto";
  textarea.style.height = `${Math.min(320, Math.max(72, textarea.scrollHeight + 2))}px`;
}
