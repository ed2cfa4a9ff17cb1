/* Governance: the tenant's pending approvals, and in a cell what held it, Approve / Reject with
 * the approver key, the decision. */

import { clockTime, el, formatSeconds, hooks, state } from "./page.js";
import { api } from "./api.js";
import { openApproverPanel, showApproverToggle } from "./approver.js";
import { setCellStatus } from "./status.js";

// -- approvals ---------------------------------------------------------------------------

/** The tenant's pending approvals: counts per session, and held cells of the open one. */
export async function refreshApprovals() {
  const asked = ++state.approvalsAsked;
  let approvals;
  try {
    approvals = await api("GET", "/v1/approvals");
  } catch (_) {
    return;
  }
  if (asked !== state.approvalsAsked || !Array.isArray(approvals)) return;
  state.waiting = new Map();
  for (const approval of approvals) {
    state.waiting.set(approval.session_id, (state.waiting.get(approval.session_id) || 0) + 1);
    if (approval.session_id !== state.current) continue;
    // A watcher that joins while a cell is held gets no pending_approval frame for it.
    const cell = state.cells.get(approval.execution_id);
    if (cell && !cell.approval && cell.node.dataset.status === "running") {
      holdCell(cell, approval);
    }
  }
  showApproverToggle();
}

/** One refresh for a burst of changes (a history replay holds many). */
function refreshSoon() {
  if (state.refreshTimer || !state.current) return;
  state.refreshTimer = setTimeout(() => {
    state.refreshTimer = null;
    if (state.key) hooks.refreshSessions().catch(() => {});
  }, 250);
}

/** Show the cell as held: what held it, when that ends, and Approve / Reject. `held` is a
 *  pending_approval frame (rule ids) or an approval of GET /v1/approvals (rule matches). */
export function holdCell(cell, held) {
  const id = held.approval_id;
  if (typeof id !== "string") return;
  if (cell.approval && cell.approval.id === id) {
    if (!cell.approval.decided) showRules(cell, held.rules);
    return;
  }
  const expires = el("span", { class: "approval-expires", "data-expires": held.expires_at,
    title: `Expires at ${held.expires_at}` });
  const comment = el("input", {
    class: "approval-comment", type: "text", maxlength: 2000, "aria-label": "Comment",
    placeholder: "Comment (optional)", autocomplete: "off", spellcheck: "false",
  });
  const approve = el("button", { class: "button small approve", type: "button", text: "Approve" });
  const reject = el("button", { class: "button small reject", type: "button", text: "Reject" });
  const error = el("div", { class: "approval-error", role: "alert", hidden: true });
  const node = el("div", { class: "cell-approval", "data-state": "pending",
    "data-approval-id": id },
  el("div", { class: "approval-head" },
    el("span", { class: "approval-icon", "aria-hidden": "true" }),
    el("strong", { class: "approval-title", text: "Waiting for approval" }),
    expires),
  el("ul", { class: "approval-rules" }),
  el("div", { class: "approval-actions" }, comment, reject, approve),
  error);
  cell.approval = { id, node, decided: false, approve, reject, comment, error, rules: [] };
  approve.addEventListener("click", () => decide(cell, "approve"));
  reject.addEventListener("click", () => decide(cell, "reject"));
  cell.node.querySelector(".cell-approval")?.remove();
  cell.outputs.before(node);
  showRules(cell, held.rules);
  updateExpiry(expires);
  setCellStatus(cell, "pending_approval");
  showApproverToggle();
  // The event names the rules; the approval itself has their lines and messages.
  if (!(held.rules || []).some((rule) => rule && typeof rule === "object")) {
    api("GET", `/v1/approvals/${encodeURIComponent(id)}`)
      .then((approval) => { if (cell.approval && cell.approval.id === id) showRules(cell, approval.rules); })
      .catch(() => {});
  }
  refreshSoon();
}

/** Rules as ids (from the event) or as matches {rule, line, matched, message}. */
function showRules(cell, rules) {
  if (!Array.isArray(rules) || !rules.length) return;
  const detailed = rules.filter((rule) => rule && typeof rule === "object");
  if (!detailed.length && cell.approval.rules.length) return;  // keep the details we have
  cell.approval.rules = rules;
  const list = cell.approval.node.querySelector(".approval-rules");
  list.replaceChildren(...rules.map((rule) => {
    if (typeof rule === "string") {
      return el("li", {}, el("span", { class: "rule-id mono", text: rule }));
    }
    const where = [Number.isInteger(rule.line) ? `line ${rule.line}` : null,
      typeof rule.matched === "string" ? rule.matched : null].filter(Boolean).join(" · ");
    return el("li", {},
      el("span", { class: "rule-id mono", text: String(rule.rule) }),
      where ? el("span", { class: "rule-where mono", text: where }) : null,
      typeof rule.message === "string" && rule.message
        ? el("span", { class: "rule-message", text: rule.message }) : null);
  }));
}

function updateExpiry(node) {
  const left = (Date.parse(node.dataset.expires) - Date.now()) / 1000;
  if (!Number.isFinite(left)) { node.textContent = ""; return; }
  const at = clockTime(node.dataset.expires);
  node.textContent = left > 0 ? `expires in ${formatSeconds(left)} (at ${at})`
    : `expired at ${at}`;
  node.classList.toggle("soon", left < 60);
}

export function tickExpiries() {
  for (const node of document.querySelectorAll(
    "#transcript .cell-approval[data-state=pending] .approval-expires")) updateExpiry(node);
}

async function decide(cell, verb) {
  const held = cell.approval;
  if (!held || held.decided) return;
  const { approve, reject, comment, error } = held;
  approve.disabled = true;
  reject.disabled = true;
  (verb === "approve" ? approve : reject).textContent =
    verb === "approve" ? "Approving…" : "Rejecting…";
  error.hidden = true;
  const text = comment.value.trim();
  const usingApprover = Boolean(state.approverKey);
  try {
    const answer = await api("POST", `/v1/approvals/${encodeURIComponent(held.id)}/${verb}`, {
      json: text ? { comment: text } : {}, key: state.approverKey || undefined,
    });
    // The approval frame on the watch socket says the same; whichever comes first shows.
    showDecision(cell, { approval_id: held.id, decision: answer.status,
      by: answer.decided_by, at: answer.decided_at, comment: answer.comment });
  } catch (failure) {
    if (failure.status === 401 && !usingApprover) return;  // signed out
    approve.disabled = false;
    reject.disabled = false;
    approve.textContent = "Approve";
    reject.textContent = "Reject";
    showApprovalError(cell, failure, usingApprover, verb);
  }
}

function showApprovalError(cell, failure, usingApprover, verb) {
  const { error } = cell.approval;
  const parts = [];
  if (failure.status === 403) {
    parts.push(el("span", { text: usingApprover
      ? "The saved approver key may not decide this approval. "
      : `Only an approver can ${verb} a held cell, and you are signed in with an agent's key. ` }));
    parts.push(el("button", { class: "link-button", type: "button",
      text: usingApprover ? "Change the approver key" : "Add an approver key",
      onclick: () => openApproverPanel() }));
    parts.push(el("span", { class: "approval-detail", text: `The gateway said: ${failure.message}` }));
  } else if (failure.status === 401) {
    parts.push(el("span", { text: "The gateway refused the saved approver key. " }));
    parts.push(el("button", { class: "link-button", type: "button", text: "Change it",
      onclick: () => openApproverPanel() }));
  } else if (failure.status === 409) {
    parts.push(el("span", { text: `Already decided: ${failure.message}.` }));
  } else if (failure.status === 404) {
    parts.push(el("span", { text: usingApprover
      ? "The saved approver key cannot see this approval: it is another tenant's key, or the "
        + "approval is gone (withdrawn, or the gateway restarted)."
      : "This approval is gone: it was withdrawn, or the gateway restarted." }));
  } else {
    parts.push(el("span", { text: `Could not ${verb}: ${failure.message}` }));
  }
  error.replaceChildren(...parts);
  error.hidden = false;
}

const DECISIONS = {
  approved: "Approved",
  rejected: "Rejected",
  expired: "Expired",
};

/** The approval's decision, who made it and when, in place of the buttons. */
export function showDecision(cell, frame) {
  const held = cell.approval;
  if (held && held.id !== frame.approval_id) return;
  if (!held) {  // joined after the hold: show the decision alone
    holdCell(cell, { approval_id: frame.approval_id, rules: [], expires_at: frame.at });
    return showDecision(cell, frame);
  }
  const decision = DECISIONS[frame.decision] ? frame.decision : "expired";
  if (held.decided === decision) return;
  held.decided = decision;
  const node = held.node;
  node.dataset.state = decision;
  const when = clockTime(frame.at);
  const says = decision === "expired"
    ? `Expired${when ? ` at ${when}` : ""} without a decision`
    : `${DECISIONS[decision]}${frame.by ? ` by ${frame.by}` : ""}${when ? ` at ${when}` : ""}`;
  const title = node.querySelector(".approval-title");
  title.textContent = says;
  if (frame.at) title.title = frame.at;
  const expires = node.querySelector(".approval-expires");
  expires.replaceChildren();
  expires.removeAttribute("title");
  if (frame.comment) expires.append(el("q", { class: "approval-comment-text", text: frame.comment }));
  node.querySelector(".approval-actions")?.remove();
  held.error.remove();
  if (decision === "approved" && cell.node.dataset.status === "pending_approval") {
    setCellStatus(cell, "running");
  }
  refreshSoon();
}

export function withdrawApproval(cell) {
  const held = cell.approval;
  held.decided = "withdrawn";
  held.node.dataset.state = "withdrawn";
  held.node.querySelector(".approval-title").textContent = "No longer waiting: it ended before a decision";
  held.node.querySelector(".approval-expires").replaceChildren();
  held.node.querySelector(".approval-expires").removeAttribute("title");
  held.node.querySelector(".approval-actions")?.remove();
  held.error.remove();
}
