/* The open session's Terminal tab: a shell in the sandbox, drawn by xterm.js (vendored under
 * vendor/, loaded the first time the tab opens) on the terminal WebSocket.
 *
 * The socket's frames: the server's `started` (the terminal's id), `output`, and a last `exit`;
 * ours `input`, `resize` and `kill`. Closing the socket leaves the shell running, so the page
 * keeps the id per session in sessionStorage and reattaches with it (after a reload, or a lost
 * connection), and the server then sends the terminal's recent output again; a terminal that
 * ended meanwhile is replaced by a new one.
 */

import { $, hooks, state } from "./page.js";
import { sessionPath, socketUrl } from "./api.js";
import { showNetwork } from "./network.js";

const STORAGE_PREFIX = "replgate.terminal.";
const THEME = {
  background: "#1f2430", foreground: "#e6e8ee", cursor: "#c7d2fe", selectionBackground: "#4f46e566",
};

let modules = null;  // the vendored xterm.js modules, imported once

function loadXterm() {
  modules = modules || Promise.all([import("./vendor/xterm.mjs"), import("./vendor/addon-fit.mjs")])
    .then(([xterm, fit]) => ({ Terminal: xterm.Terminal, FitAddon: fit.FitAddon }));
  return modules;
}

// -- tabs --------------------------------------------------------------------------------

/** Show the open session's `notebook`, `terminal` or `network` view (the hash names it). */
export function showTab(tab) {
  for (const name of ["notebook", "terminal", "network"]) {
    $(`${name}-view`).hidden = name !== tab;
    $(`tab-${name}`).setAttribute("aria-selected", String(name === tab));
  }
  if (tab === "terminal") openTerminal();
  else if (tab === "network") showNetwork();
  else $("code").focus();
}

/** Point the tabs at the session's views. */
export function setTabLinks(id) {
  $("tab-notebook").href = `#/s/${id}`;
  $("tab-terminal").href = `#/s/${id}/terminal`;
  $("tab-network").href = `#/s/${id}/network`;
}

// -- the terminal ------------------------------------------------------------------------

function setTerminalState(name, text) {
  $("terminal-state").dataset.state = name;
  $("terminal-text").textContent = text;
  $("terminal-new").hidden = name !== "exited";
  $("terminal-kill").hidden = name === "exited";
}

async function openTerminal() {
  const sessionId = state.current;
  if (state.terminal && state.terminal.sessionId === sessionId) {
    fitLater(state.terminal);
    if (state.terminal.term) state.terminal.term.focus();
    return;
  }
  closeTerminal();
  const t = { sessionId, socket: null, started: false, exited: false, retry: 0, timer: null };
  state.terminal = t;
  setTerminalState("connecting", "Connecting");
  const { Terminal, FitAddon } = await loadXterm();
  if (state.terminal !== t) return;
  t.term = new Terminal({
    cursorBlink: true, fontSize: 13, scrollback: 5000, theme: THEME,
    fontFamily: getComputedStyle(document.body).getPropertyValue("--mono"),
  });
  t.fit = new FitAddon();
  t.term.loadAddon(t.fit);
  const host = $("terminal");
  host.replaceChildren();
  t.term.open(host);
  t.fit.fit();
  t.term.onData((data) => send(t, { type: "input", data }));
  t.term.onResize(({ cols, rows }) => {
    host.dataset.cols = String(cols);
    host.dataset.rows = String(rows);
    send(t, { type: "resize", cols, rows });
  });
  host.dataset.cols = String(t.term.cols);
  host.dataset.rows = String(t.term.rows);
  t.observer = new ResizeObserver(() => fitLater(t));
  t.observer.observe(host);
  connect(t);
  t.term.focus();
}

function fitLater(t) {
  // A hidden host has no size: fit() then keeps the size it had.
  if (!t.fit) return;
  cancelAnimationFrame(t.frame);
  t.frame = requestAnimationFrame(() => { if (state.terminal === t) t.fit.fit(); });
}

function storageKey(t) { return STORAGE_PREFIX + t.sessionId; }

function connect(t) {
  const known = sessionStorage.getItem(storageKey(t));
  const query = new URLSearchParams({ cols: String(t.term.cols), rows: String(t.term.rows) });
  if (known) query.set("id", known);
  const socket = new WebSocket(`${socketUrl(`${sessionPath(t.sessionId)}/terminal`)}&${query}`);
  t.socket = socket;
  t.started = false;
  t.reattaching = Boolean(known);
  socket.onmessage = (message) => {
    if (t.socket === socket) onFrame(t, JSON.parse(message.data));
  };
  socket.onclose = (event) => {
    if (t.socket !== socket || state.terminal !== t) return;
    t.socket = null;
    onClosed(t, event);
  };
}

function onFrame(t, frame) {
  switch (frame.type) {
    case "started":
      // A reattached terminal's recent output follows: it redraws the screen from clean.
      if (t.reattaching) t.term.reset();
      t.started = true;
      t.retry = 0;
      sessionStorage.setItem(storageKey(t), frame.id);
      $("terminal").dataset.terminalId = frame.id;
      setTerminalState("live", "Connected");
      // The size may have changed while the socket opened.
      send(t, { type: "resize", cols: t.term.cols, rows: t.term.rows });
      return;
    case "output":
      t.term.write(frame.data);
      return;
    case "exit": {
      t.exited = true;
      sessionStorage.removeItem(storageKey(t));
      const code = frame.exit_code === null || frame.exit_code === undefined
        ? frame.status : `exit code ${frame.exit_code}`;
      t.term.write(`\r\n\x1b[2m[the shell ended: ${code}]\x1b[0m\r\n`);
      setTerminalState("exited", `Ended (${code})`);
      return;
    }
    default:
  }
}

function onClosed(t, event) {
  if (t.exited) return;
  if (event.code === 4401) {
    hooks.signOut("The API key was refused. Sign in again.");
    return;
  }
  if (event.code >= 4000) {
    if (!t.started && t.reattaching) {
      // The remembered terminal is gone (it ended while no page watched it): start another.
      sessionStorage.removeItem(storageKey(t));
      connect(t);
      return;
    }
    // Refused (the session ended or cannot take a terminal now): say why, offer another try.
    t.exited = true;
    setTerminalState("exited", event.reason || `Closed (${event.code})`);
    return;
  }
  // The connection dropped: the shell runs on, reattach to it.
  setTerminalState("offline", "Reconnecting");
  const delay = Math.min(10000, 500 * 2 ** t.retry);
  t.retry += 1;
  t.timer = setTimeout(() => { if (state.terminal === t) connect(t); }, delay);
}

function send(t, frame) {
  if (t.socket && t.started && t.socket.readyState === WebSocket.OPEN) {
    t.socket.send(JSON.stringify(frame));
  }
}

/** End the open session's shell (and what runs in it). */
export function killTerminal() {
  if (state.terminal) send(state.terminal, { type: "kill" });
}

/** A fresh shell in place of one that ended. */
export function newTerminal() {
  const t = state.terminal;
  if (!t || t.socket) return;
  t.exited = false;
  t.retry = 0;
  t.term.reset();
  sessionStorage.removeItem(storageKey(t));
  setTerminalState("connecting", "Connecting");
  connect(t);
  t.term.focus();
}

/** Leave the terminal (its shell keeps running): on closing the session or signing out. */
export function closeTerminal() {
  const t = state.terminal;
  state.terminal = null;
  if (!t) return;
  clearTimeout(t.timer);
  cancelAnimationFrame(t.frame);
  if (t.socket) { t.socket.onclose = null; t.socket.close(); }
  if (t.observer) t.observer.disconnect();
  if (t.term) t.term.dispose();
  $("terminal").replaceChildren();
}
