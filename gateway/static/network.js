/* The open session's Network tab: the network policy its sandbox runs under (its own, else its
 * profile's), the secret rules that put a tenant's secrets into matching HTTPS requests, and the
 * latest attempts its egress proxy decided.
 *
 * A policy never holds a secret's value: a rule's header names a secret by its placeholder
 * (`{secret:NAME}`), which is shown as a chip naming the secret, and the values stay in the
 * gateway. Everything goes into the DOM as text.
 */

import { $, clockTime, el, state } from "./page.js";
import { api, sessionPath } from "./api.js";

const PLACEHOLDER = /\{secret:([A-Za-z0-9_][A-Za-z0-9_.-]{0,63})\}/g;
const ATTEMPTS_SHOWN = 50;

let loading = 0;  // the latest load's number: an older answer arriving late is dropped

/** Load and show the open session's policy and egress log. */
export async function showNetwork() {
  const sessionId = state.current;
  const mine = ++loading;
  $("network-error").textContent = "";
  try {
    const [policy, attempts] = await Promise.all([
      api("GET", `${sessionPath(sessionId)}/network`),
      api("GET", `${sessionPath(sessionId)}/egress`),
    ]);
    if (mine !== loading || sessionId !== state.current) return;
    renderPolicy(policy);
    renderAttempts(attempts);
  } catch (error) {
    if (mine !== loading || error.status === 401) return;
    $("network-error").textContent = `Could not load the network policy: ${error.message}`;
  }
}

function renderPolicy(policy) {
  const open = policy.default === "allow";
  const badge = $("network-default");
  badge.className = `badge network-default ${open ? "open" : "closed"}`;
  badge.textContent = open ? "open by default" : "closed by default";
  badge.title = open ? "Attempts no entry matches are allowed"
    : "Attempts no entry matches are refused";
  renderEntries($("network-allow"), policy.allow, open ? "No allow entries." : "Nothing is allowed.");
  renderEntries($("network-deny"), policy.deny, "No deny entries.");
  const rules = policy.rules || [];
  $("network-rules").replaceChildren(...rules.map(ruleRow));
  $("network-rules-empty").hidden = rules.length > 0;
  $("network-rules-table").hidden = rules.length === 0;
}

function renderEntries(list, entries, empty) {
  list.replaceChildren(...(entries.length
    ? entries.map((entry) => el("li", { class: "mono", text: entry }))
    : [el("li", { class: "muted", text: empty })]));
}

/** A header value with its placeholders as chips naming the secret (never a value). */
function headerValue(text) {
  const node = el("span", { class: "mono" });
  let last = 0;
  for (const match of text.matchAll(PLACEHOLDER)) {
    node.append(text.slice(last, match.index));
    node.append(el("span", {
      class: "secret-chip", "data-secret": match[1], text: `secret ${match[1]}`,
      title: `The tenant's secret ${match[1]}: put in by the egress proxy, never shown`,
    }));
    last = match.index + match[0].length;
  }
  node.append(text.slice(last));
  return node;
}

function ruleRow(rule) {
  const headers = Object.entries(rule.headers || {});
  return el("tr", { class: "network-rule" },
    el("td", { class: "mono", text: `${rule.host}:${rule.port}` }),
    el("td", { text: rule.methods.length ? rule.methods.join(", ") : "any" }),
    el("td", { class: "mono", text: rule.paths.length ? rule.paths.join(", ") : "any" }),
    el("td", {},
      ...headers.map(([name, value]) => el("div", { class: "rule-header" },
        el("span", { class: "mono", text: `${name}: ` }), headerValue(value))),
      ...(rule.secrets || []).map((name) => el("div", { class: "rule-header" },
        el("span", { class: "muted", text: "replaces " }),
        headerValue(`{secret:${name}}`))),
      headers.length || (rule.secrets || []).length ? null
        : el("span", { class: "muted", text: "none" })));
}

function renderAttempts(attempts) {
  const latest = attempts.slice(-ATTEMPTS_SHOWN).reverse();
  $("network-log").replaceChildren(...latest.map((attempt) => el("li", {
    class: `egress-attempt ${attempt.allowed ? "allowed" : "refused"}`,
  },
  el("span", { class: "muted", text: clockTime(attempt.time) }),
  el("span", { class: "badge", text: attempt.allowed ? "allowed" : "refused" }),
  el("span", { class: "mono", text: `${attempt.method} ${attempt.host}${
    attempt.port ? `:${attempt.port}` : ""}` }),
  el("span", { class: "muted reason", text: attempt.reason, title: attempt.reason }))));
  $("network-log-empty").hidden = latest.length > 0;
}
