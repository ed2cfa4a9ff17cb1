/* Signing in and out with the API key, and the approver key kept beside it. */

import { $, state, toast } from "./page.js";
import { api } from "./api.js";
import { closeSession, openFromHash, refreshSessions, renderSessions } from "./sessions.js";

export const KEY_STORAGE = "replgate.apiKey";
export const APPROVER_STORAGE = "replgate.approverKey";
// -- sign in -----------------------------------------------------------------------------

export function showSignIn(message) {
  $("app").hidden = true;
  $("signin").hidden = false;
  $("signin-error").textContent = message || "";
  $("key-input").focus();
}

export function showApp() {
  $("signin").hidden = true;
  $("app").hidden = false;
  clearInterval(state.pollTimer);
  state.pollTimer = setInterval(() => {
    if (document.visibilityState === "visible") refreshSessions().catch(() => {});
  }, 5000);
  openFromHash();
}

export async function signIn(event) {
  event.preventDefault();
  const key = $("key-input").value.trim();
  if (!key) return;
  $("signin-error").textContent = "";
  const response = await fetch("/v1/sessions", {
    headers: { Authorization: `Bearer ${key}` }, credentials: "omit", cache: "no-store",
  }).catch(() => null);
  if (!response) return showSignIn("Could not reach the gateway.");
  if (response.status === 401) {
    // An approver key opens no session, but it may decide approvals: keep it for that.
    const asApprover = await fetch("/v1/approvals", {
      headers: { Authorization: `Bearer ${key}` }, credentials: "omit", cache: "no-store",
    }).catch(() => null);
    if (asApprover && asApprover.ok) {
      setApproverKey(key);
      $("key-input").value = "";
      return showSignIn("That is an approver key: it decides approvals but opens no session. "
        + "It is kept as this browser's approver key; now sign in with an API key.");
    }
    return showSignIn("That key was refused.");
  }
  if (!response.ok) return showSignIn(`The gateway answered ${response.status}.`);
  state.key = key;
  localStorage.setItem(KEY_STORAGE, key);
  $("key-input").value = "";
  renderSessions(await response.json());
  showApp();
}

export function signOut(message) {
  localStorage.removeItem(KEY_STORAGE);
  state.key = null;
  state.waiting = new Map();
  state.kernelspecs = null;  // another key's tenant may have other profiles
  if (message === undefined) setApproverKey(null);  // signing out on purpose forgets both
  closeApproverPanel();
  closeSession();
  showApproverToggle();
  clearInterval(state.pollTimer);
  renderSessions([]);
  showSignIn(message);
}

// -- approver key ------------------------------------------------------------------------

export function setApproverKey(key) {
  state.approverKey = key || null;
  if (key) localStorage.setItem(APPROVER_STORAGE, key);
  else localStorage.removeItem(APPROVER_STORAGE);
  const toggle = $("approver-toggle");
  toggle.classList.toggle("on", Boolean(key));
  toggle.title = key ? "Approve and reject held cells with the saved approver key"
    : "Add an approver key to approve or reject held cells";
  $("approver-label").textContent = key ? "Approver key set" : "Add approver key";
  $("approver-forget").hidden = !key;
  showApproverToggle();
}

/** The approver key's button shows once approvals matter here: a saved key or a held cell. */
export function showApproverToggle() {
  $("approver").hidden = !(state.approverKey || state.waiting.size
    || document.querySelector("#transcript .cell-approval"));
}

export function openApproverPanel() {
  const panel = $("approver-panel");
  panel.hidden = false;
  $("approver-toggle").setAttribute("aria-expanded", "true");
  $("approver-error").textContent = "";
  $("approver-input").value = "";
  $("approver-input").placeholder = state.approverKey ? "saved (paste to replace)" : "approver key";
  $("approver-input").focus();
}

export function closeApproverPanel() {
  $("approver-panel").hidden = true;
  $("approver-toggle").setAttribute("aria-expanded", "false");
}

export async function saveApproverKey(event) {
  event.preventDefault();
  const key = $("approver-input").value.trim();
  const error = $("approver-error");
  if (!key) { error.textContent = "Paste a key first."; return; }
  if (key === state.key) {
    error.textContent = "That is the API key you signed in with; approvers have keys of their own.";
    return;
  }
  $("approver-save").disabled = true;
  try {
    // Any key the gateway knows may list approvals: this catches typos, not agent keys.
    await api("GET", "/v1/approvals", { key });
  } catch (failure) {
    error.textContent = failure.status === 401 ? "The gateway does not know that key."
      : `Could not check the key: ${failure.message}`;
    return;
  } finally {
    $("approver-save").disabled = false;
  }
  setApproverKey(key);
  closeApproverPanel();
  toast("Approver key saved in this browser.");
}
