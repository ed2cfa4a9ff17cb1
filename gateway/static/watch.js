/* The open session's sockets: the watch socket's frames (its whole history, then live), the
 * pause/resume bar, and running code through the ws socket. */

import { $, autosize, formatSize, hooks, randomId, saveBlob, scrollToEnd, shortId, state, toast }
  from "./page.js";
import { api, sessionPath, socketUrl } from "./api.js";
import { setCellStatus, setStatusBadge } from "./status.js";
import { refreshApprovals } from "./approvals.js";
import { addEvent, createCell, rejectCell, startCell } from "./cells.js";

// -- watching ----------------------------------------------------------------------------

function setLive(stateName, text) {
  $("live").dataset.state = stateName;
  $("live-text").textContent = text;
}

export function connectWatch() {
  const id = state.current;
  setLive("connecting", "Connecting");
  const socket = new WebSocket(socketUrl(`${sessionPath(id)}/watch`));
  state.watch = socket;
  socket.onopen = () => {
    // The watch socket replays the whole history: start from a clean transcript.
    for (const [executionId, cell] of state.cells) {
      if (!cell.pending) { cell.node.remove(); state.cells.delete(executionId); }
    }
    state.displays.clear();
  };
  socket.onmessage = (message) => {
    if (state.watch !== socket) return;
    onWatchFrame(JSON.parse(message.data));
  };
  socket.onclose = (event) => {
    if (state.watch !== socket || state.current !== id) return;
    state.watch = null;
    if (event.code === 4401) return hooks.signOut("The API key was refused. Sign in again.");
    if (event.code === 4404) return sessionEnded();
    setLive("offline", "Reconnecting");
    const delay = Math.min(10000, 500 * 2 ** state.retry);
    state.retry += 1;
    state.retryTimer = setTimeout(() => { if (state.current === id) connectWatch(); }, delay);
  };
}

function sessionEnded() {
  toast("The session has ended.", "error");
  location.hash = "";
  hooks.refreshSessions().catch(() => {});
}

function onWatchFrame(frame) {
  switch (frame.type) {
    case "history_end":
      state.retry = 0;
      setLive("live", "Live");
      scrollToEnd(true);
      refreshApprovals();
      return;
    case "lagged":
      toast("Fell behind the session's output; catching up.");
      return;
    case "execution":
      startCell(frame.execution_id, frame.code, frame.started_at);
      return;
    case "transfer":
      showTransfer(frame);
      return;
    default: {
      const cell = state.cells.get(frame.execution_id);
      if (cell) addEvent(cell, frame);
    }
  }
}

// -- pause and resume progress -------------------------------------------------------------

// A pause or resume of the watched session moving its variables: a bar while it runs, its
// outcome for a moment after it ends.
export function showTransfer(frame) {
  const box = $("transfer");
  const total = frame.total_bytes;
  const pct = total ? Math.min(100, Math.floor((100 * frame.done_bytes) / total)) : 0;
  const verb = frame.operation === "pause" ? "Pausing" : "Resuming";
  box.dataset.operation = frame.operation;
  box.dataset.state = frame.state;
  box.setAttribute("aria-valuenow", String(pct));
  $("transfer-bar").style.width = `${pct}%`;
  clearTimeout(state.transferTimer);
  if (frame.state === "running") {
    const of = total ? ` of ${formatSize(total)}` : "";
    $("transfer-text").textContent = `${verb}: ${formatSize(frame.done_bytes)}${of}`;
  } else {
    const past = frame.operation === "pause" ? "Paused" : "Resumed";
    $("transfer-text").textContent = frame.state === "done"
      ? `${past}: ${formatSize(frame.done_bytes)}` : `${verb} failed`;
    state.transferTimer = setTimeout(() => { box.hidden = true; }, 2000);
    hooks.refreshSessions().catch(() => {});
  }
  box.hidden = false;
}

// -- running code ------------------------------------------------------------------------

function runner() {
  if (state.runner && state.runner.readyState <= WebSocket.OPEN) return state.runner;
  const id = state.current;
  const socket = new WebSocket(socketUrl(`${sessionPath(id)}/ws`));
  state.runner = socket;
  socket.onopen = () => {
    for (const message of state.runnerQueue.splice(0)) socket.send(JSON.stringify(message));
  };
  socket.onmessage = (message) => {
    const frame = JSON.parse(message.data);
    // Output arrives on the watch socket; this one only reports refusals.
    if (frame.type === "rejected") {
      const cell = frame.execution_id && state.cells.get(frame.execution_id);
      const detail = typeof frame.detail === "string" ? frame.detail : "invalid request";
      if (cell) rejectCell(cell, detail);
      toast(`Not run: ${detail}`, "error");
    }
  };
  socket.onclose = (event) => {
    if (state.runner === socket) state.runner = null;
    if (event.code === 4401) hooks.signOut("The API key was refused. Sign in again.");
    if (event.code === 4404 && state.current === id) sessionEnded();
  };
  return socket;
}

function send(message) {
  const socket = runner();
  if (socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify(message));
  else state.runnerQueue.push(message);
}

export function runCode(event) {
  if (event) event.preventDefault();
  const textarea = $("code");
  const code = textarea.value;
  if (!code.trim() || !state.current) return;
  const id = randomId();
  const language = $("language").value || "python";
  const cell = createCell(id, code, language);
  cell.pending = true;
  setCellStatus(cell, "queued");
  $("transcript").append(cell.node);
  $("transcript-empty").hidden = true;
  send(language === "python" ? { type: "execute", code, id }
    : { type: "execute", code, id, language });
  textarea.value = "";
  autosize();
  scrollToEnd(true);
}

export async function interrupt() {
  if (!state.current) return;
  try {
    const answer = await api("POST", `${sessionPath(state.current)}/interrupt`);
    if (!answer.interrupted) toast("Nothing was running.");
  } catch (error) {
    if (error.status !== 401) toast(`Could not interrupt: ${error.message}`, "error");
  }
}

export async function restart() {
  if (!state.current) return;
  const button = $("restart");
  button.disabled = true;
  setStatusBadge($("session-status"), "starting");
  try {
    await api("POST", `${sessionPath(state.current)}/restart`);
    toast("Kernel restarted: variables are gone, files kept.");
  } catch (error) {
    if (error.status !== 401) toast(`Could not restart: ${error.message}`, "error");
  } finally {
    button.disabled = false;
    hooks.refreshSessions().catch(() => {});
  }
}

export async function downloadNotebook() {
  if (!state.current) return;
  try {
    const notebook = await api("GET", `${sessionPath(state.current)}/notebook`);
    const blob = new Blob([JSON.stringify(notebook, null, 1)], { type: "application/x-ipynb+json" });
    saveBlob(blob, `replgate-${shortId(state.current)}.ipynb`);
  } catch (error) {
    if (error.status !== 401) toast(`Could not export: ${error.message}`, "error");
  }
}
