/* The approver key: a person's key, kept beside the API key in this browser, that decides
 * approvals; its button and panel. */

import { $, state, toast } from "./page.js";
import { api } from "./api.js";

export const APPROVER_STORAGE = "replgate.approverKey";

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
