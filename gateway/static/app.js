/* replgate's web UI: plain JS, no build step. This module starts it; the others are its views
 * and helpers, ES modules the browser loads itself (index.html names this one). Its one
 * dependency, xterm.js for the terminal tab, is vendored under vendor/ (see its lock.json).
 *
 * Kernel output is untrusted. Text goes into the DOM only as text nodes (never innerHTML);
 * HTML and SVG go into iframes with sandbox="allow-scripts" and no allow-same-origin, so their
 * scripts run in an opaque origin: no access to this page, its localStorage (the API key) or
 * its cookies. Those frames also inherit the page's Content-Security-Policy, and add their own
 * that forbids any network connection; their scripts run because this page gives them the
 * nonce of its response (they are still inside the sandbox).
 *
 * Governance: a cell a policy holds shows what held it and Approve / Reject buttons. Those call
 * the API with the approver key (kept apart from the API key, also in localStorage) or, without
 * one, with the API key, which the gateway refuses (403) and the cell says so.
 */

import { $, autosize, hooks, state, toast } from "./page.js";
import { APPROVER_STORAGE, closeApproverPanel, openApproverPanel, saveApproverKey, setApproverKey }
  from "./approver.js";
import { KEY_STORAGE, showApp, showSignIn, signIn, signOut } from "./signin.js";
import { createSession, openFromHash, refreshSessions } from "./sessions.js";
import { downloadNotebook, interrupt, restart, runCode } from "./watch.js";
import { uploadFiles } from "./files.js";
import { killTerminal, newTerminal } from "./terminal.js";
import { setPlaceholder } from "./cells.js";
import { tickExpiries } from "./approvals.js";
import { onFrameMessage } from "./output.js";
import { showNetwork } from "./network.js";
import { refreshTemplates } from "./templates.js";

async function start() {
  hooks.signOut = signOut;
  hooks.refreshSessions = refreshSessions;
  bindUi();
  window.addEventListener("message", onFrameMessage);
  window.addEventListener("hashchange", () => openFromHash());
  setInterval(tickExpiries, 1000);
  setApproverKey(localStorage.getItem(APPROVER_STORAGE));
  const stored = localStorage.getItem(KEY_STORAGE);
  if (!stored) return showSignIn();
  state.key = stored;
  try {
    await refreshSessions();
  } catch (error) {
    if (error.status === 401) return;
    return showSignIn(`Could not reach the gateway: ${error.message}`);
  }
  showApp();
}

function onCodeKey(event) {
  if (event.key === "Enter" && (event.shiftKey || event.ctrlKey || event.metaKey)) {
    runCode(event);
  } else if (event.key === "Tab" && !event.shiftKey) {
    event.preventDefault();
    const t = event.target;
    t.setRangeText("    ", t.selectionStart, t.selectionEnd, "end");
    autosize();
  }
}

function bindUi() {
  $("signin-form").addEventListener("submit", signIn);
  $("signout").addEventListener("click", () => signOut());
  $("new-session").addEventListener("click", createSession);
  $("composer").addEventListener("submit", runCode);
  $("code").addEventListener("keydown", onCodeKey);
  $("code").addEventListener("input", autosize);
  $("language").addEventListener("change", setPlaceholder);
  $("interrupt").addEventListener("click", interrupt);
  $("restart").addEventListener("click", restart);
  $("download-notebook").addEventListener("click", downloadNotebook);
  $("upload-input").addEventListener("change", uploadFiles);
  $("terminal-kill").addEventListener("click", killTerminal);
  $("terminal-new").addEventListener("click", newTerminal);
  $("network-refresh").addEventListener("click", showNetwork);
  $("templates-refresh").addEventListener("click", refreshTemplates);
  $("approver-toggle").addEventListener("click", () => {
    if ($("approver-panel").hidden) openApproverPanel(); else closeApproverPanel();
  });
  $("approver-panel").addEventListener("submit", saveApproverKey);
  $("approver-input").addEventListener("input", () => { $("approver-error").textContent = ""; });
  $("approver-forget").addEventListener("click", () => {
    setApproverKey(null);
    closeApproverPanel();
    toast("Approver key forgotten.");
  });
  document.addEventListener("keydown", (event) => {
    if (event.key === "Escape" && !$("approver-panel").hidden) closeApproverPanel();
  });
  document.addEventListener("click", (event) => {
    if (!$("approver-panel").hidden && !event.target.closest(".approver")
        && !event.target.closest(".link-button")) closeApproverPanel();
  });
}

start();
