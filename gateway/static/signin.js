/* Signing in and out with the API key. */

import { $, state } from "./page.js";
import { closeApproverPanel, setApproverKey, showApproverToggle } from "./approver.js";
import { closeSession, openFromHash, refreshSessions, renderSessions } from "./sessions.js";
import { closeTemplates, refreshTemplates } from "./templates.js";

export const KEY_STORAGE = "replgate.apiKey";
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
  refreshTemplates();
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
  closeTemplates();
  showApproverToggle();
  clearInterval(state.pollTimer);
  renderSessions([]);
  showSignIn(message);
}
