"""The inbox's pages: server-rendered HTML, every value escaped, a few lines of script for live
updates (polling) and against double submits. No build step."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from html import escape
from typing import Any
from urllib.parse import urlencode

from exactcall.approvals import ApprovalRequest
from exactcall.inbox._decide import Answer

__all__ = [
    "answer_page",
    "call_page",
    "call_status",
    "error_page",
    "inbox_page",
    "login_page",
    "pending_rows",
    "run_page",
]

STYLE = """
body{font:15px/1.45 system-ui,sans-serif;margin:0;color:#1d2733;background:#f6f7f9}
header{background:#1d2733;color:#fff;padding:.6em 1.2em;display:flex;gap:1em;align-items:center}
header a{color:#fff;text-decoration:none;font-weight:600}header .me{margin-left:auto}
main{padding:1em 1.2em;max-width:70em}table{border-collapse:collapse;width:100%;background:#fff}
th,td{text-align:left;padding:.4em .6em;border-bottom:1px solid #dde1e6;vertical-align:top}
code,pre{font:13px ui-monospace,monospace}pre{background:#fff;border:1px solid #dde1e6;padding:.6em}
.hash{word-break:break-all}.muted{color:#5b6673}
.warn{background:#fff4d6;padding:.6em;border:1px solid #e9c46a}
.ok{background:#e3f6e8;padding:.6em;border:1px solid #76c08b}
.bad{background:#fde4e1;padding:.6em;border:1px solid #e08a7f}
button{font:inherit;padding:.35em 1em;margin-right:.5em}
input[type=text],input[type=password]{font:inherit;width:28em}
"""

NO_DOUBLE_SUBMIT = (
    "document.querySelectorAll('form.decide').forEach(f=>f.addEventListener('submit',e=>{"
    "if(f.dataset.sent){e.preventDefault();return}f.dataset.sent=1;"
    "setTimeout(()=>f.querySelectorAll('button').forEach(b=>b.disabled=true),0)}));"
)


def _poll(url: str, target: str, every_ms: int = 1000) -> str:
    return (
        f"<script>setInterval(async()=>{{try{{const r=await fetch({json.dumps(url)},"
        "{credentials:'same-origin',cache:'no-store'});"
        f"if(r.ok)document.getElementById({json.dumps(target)}).innerHTML=await r.text()}}"
        f"catch(e){{}}}},{every_ms});</script>"
    )


def _layout(title: str, body: str, who: str | None = None, csrf: str | None = None) -> str:
    me = ""
    if who is not None:
        out = (
            f'<form method="post" action="/logout" style="display:inline">'
            f'<input type="hidden" name="csrf" value="{escape(csrf or "")}">'
            '<button type="submit">Log out</button></form>'
            if csrf
            else ""
        )
        me = f'<span class="me">signed in as <b id="me">{escape(who)}</b> {out}</span>'
    return (
        f"<!doctype html><html><head><meta charset=utf-8><title>{escape(title)} · exactcall "
        f'inbox</title><style>{STYLE}</style></head><body><header><a href="/">exactcall inbox'
        f"</a>{me}</header><main>{body}</main><script>{NO_DOUBLE_SUBMIT}</script></body></html>"
    )


def _when(t: datetime) -> str:
    secs = int((t - datetime.now(UTC)).total_seconds())
    rel = f"in {_span(secs)}" if secs > 0 else f"expired {_span(-secs)} ago"
    return f'<span title="{t.isoformat()}">{t:%Y-%m-%d %H:%M:%S} UTC ({rel})</span>'


def _ago(t: datetime) -> str:
    secs = max(0, int((datetime.now(UTC) - t).total_seconds()))
    return f'<span title="{t.isoformat()}">{t:%Y-%m-%d %H:%M:%S} UTC ({_span(secs)} ago)</span>'


def _span(secs: int) -> str:
    return f"{secs // 3600}h {secs % 3600 // 60}m {secs % 60}s"


def _call_url(r: ApprovalRequest) -> str:
    return "/call?" + urlencode({"wf": r.workflow_id, "step": r.step})


def why_waits(r: ApprovalRequest) -> str:
    parts = ["the tool needs a person's approval"]
    parts += [escape(x) for x in r.reasons]
    if r.approvals_needed > 1:
        by = ", ".join(r.approved_by) or "nobody yet"
        parts.append(f"{len(r.approved_by)} of {r.approvals_needed} approvals ({escape(by)})")
    return "; ".join(parts)


def _args_line(args: dict[str, Any], limit: int = 120) -> str:
    text = json.dumps(args, sort_keys=True)
    return escape(text if len(text) <= limit else text[: limit - 1] + "…")


def pending_rows(reqs: Sequence[ApprovalRequest]) -> str:
    if not reqs:
        return '<tr><td colspan=6 class="muted">No call is waiting.</td></tr>'
    rows = []
    for r in sorted(reqs, key=lambda r: r.requested_at):
        rows.append(
            f'<tr class="pending" data-wf="{escape(r.workflow_id)}" data-step="{escape(r.step)}">'
            f'<td><a href="{escape(_call_url(r))}">{escape(r.tool)}</a><br>'
            f'<span class="muted">{escape(r.step)}</span></td>'
            f"<td><code>{_args_line(r.args)}</code></td><td>{why_waits(r)}</td>"
            f'<td>{escape(r.requested_by or "(not named)")}<br><a class=muted href="/run?'
            f'{escape(urlencode({"wf": r.workflow_id}))}">{escape(r.workflow_id)}</a></td>'
            f"<td>{_when(r.expires_at)}</td></tr>"
        )
    return "".join(rows)


def inbox_page(reqs: Sequence[ApprovalRequest], who: str, csrf: str) -> str:
    body = (
        "<h1>Calls waiting for approval</h1><p class=muted>Updates by itself. Each decision is "
        "bound to the exact arguments the call's page shows.</p><table><thead><tr><th>Tool</th>"
        "<th>Arguments</th><th>Why it waits</th><th>Asked by / run</th><th>Expires</th></tr>"
        f'</thead><tbody id="pending">{pending_rows(reqs)}</tbody></table>'
        + _poll("/pending.part", "pending")
    )
    return _layout("Waiting", body, who, csrf)


def call_status(r: ApprovalRequest | None, shown_hash: str, gone: str = "") -> str:
    if r is None:
        return f'<p class="warn" id="gone">{escape(gone)}. Deciding here will send nothing.</p>'
    if r.args_hash != shown_hash:
        return (
            '<p class="warn" id="changed">The call changed since this page was loaded: its '
            f"arguments now hash to <code>{escape(r.args_hash)}</code>. Reload to read them.</p>"
        )
    return f'<p class="muted" id="waiting">Still waiting: {why_waits(r)}.</p>'


SIGN_IN_BROWSER = """
document.querySelectorAll('form.decide').forEach(f=>f.addEventListener('submit',async e=>{
const file=document.getElementById('keyfile').files[0];if(!file)return;e.preventDefault();
const verdict=e.submitter.value,out=document.getElementById('signing');
try{const pem=await file.text();
const b64=pem.replace(/-----[^-]+-----/g,'').replace(/\\s+/g,'');
const der=Uint8Array.from(atob(b64),c=>c.charCodeAt(0));
const key=await crypto.subtle.importKey('pkcs8',der,{name:'Ed25519'},false,['sign']);
const data=Uint8Array.from(atob(f.dataset[verdict]),c=>c.charCodeAt(0));
const sig=new Uint8Array(await crypto.subtle.sign({name:'Ed25519'},key,data));
f.elements.signature.value=btoa(String.fromCharCode(...sig));
f.elements.verdict.value=verdict;f.submit()}
catch(err){out.textContent='Could not sign with that file ('+err+'): nothing was sent.';
delete f.dataset.sent;f.querySelectorAll('button').forEach(b=>b.disabled=false)}}));
"""


def call_page(
    r: ApprovalRequest, who: str, csrf: str, signing: str, payloads: Mapping[str, str]
) -> str:
    """``payloads``: for approve and deny, the base64 bytes a signature covers (the browser
    signs them with a key file it reads locally; the file is never sent)."""
    q = urlencode({"wf": r.workflow_id, "step": r.step, "hash": r.args_hash})
    args = escape(json.dumps(r.args, indent=2, sort_keys=True))
    hidden = "".join(
        f'<input type="hidden" name="{k}" value="{escape(v)}">'
        for k, v in (
            ("wf", r.workflow_id),
            ("step", r.step),
            ("hash", r.args_hash),
            ("csrf", csrf),
            ("signature", ""),
            ("verdict", ""),
        )
    )
    body = (
        f"<h1>{escape(r.tool)} <span class=muted>{escape(r.step)}</span></h1>"
        f'<div id="status">{call_status(r, r.args_hash)}</div>'
        f'<table><tr><th>Workflow</th><td><a href="/run?{escape(urlencode({"wf": r.workflow_id}))}'
        f'">{escape(r.workflow_id)}</a></td></tr>'
        f"<tr><th>Asked by</th><td>{escape(r.requested_by or '(not named)')}</td></tr>"
        f"<tr><th>Asked at</th><td>{_ago(r.requested_at)}</td></tr>"
        f"<tr><th>Expires</th><td>{_when(r.expires_at)}</td></tr>"
        f'<tr><th>Args hash</th><td><code class="hash" id="hash">{escape(r.args_hash)}</code>'
        "</td></tr></table><h2>Exact arguments</h2>"
        f'<pre id="args">{args}</pre>'
        f'<form class="decide" method="post" action="/decide" data-approve="'
        f'{escape(payloads["approve"])}" data-deny="{escape(payloads["deny"])}">{hidden}'
        '<p><label>Reason (kept with the decision)<br><input type="text" name="reason" '
        'maxlength="500"></label></p><p><label>Sign in this browser (optional): your Ed25519 '
        'key file, read here and never sent <input type="file" id="keyfile" accept=".pem">'
        '</label> <span id="signing" class="muted"></span></p>'
        '<button type="submit" name="decision" value="approve" id="approve">Approve exactly '
        'this call</button><button type="submit" name="decision" value="deny" id="deny">Deny'
        f"</button></form><p class=muted>You decide as <b>{escape(who)}</b> (from your login). "
        f"{escape(signing)}</p>"
        + _poll(f"/call.part?{q}", "status", 2000)
        + f"<script>{SIGN_IN_BROWSER}</script>"
    )
    return _layout(r.tool, body, who, csrf)


def answer_page(a: Answer, wf: str, step: str, who: str, csrf: str) -> str:
    cls = "ok" if a.accepted else "bad"
    link = escape("/run?" + urlencode({"wf": wf}))
    body = (
        f'<h1 id="answer-title">{escape(a.title)}</h1><p class="{cls}" id="answer">'
        f'{escape(a.detail)}</p><p>{escape(step)} of <a href="{link}">{escape(wf)}</a> · '
        '<a href="/">back to the waiting calls</a></p>'
    )
    return _layout(a.title, body, who, csrf)


def run_page(
    wf: str, pending: Sequence[ApprovalRequest], rows: Iterable[dict[str, Any]], who: str, csrf: str
) -> str:
    calls = (
        "".join(
            f"<tr><td>{escape(r['time'])}</td><td>{escape(str(r['step']))}</td>"
            f"<td>{escape(str(r['tool']))}</td>"
            f"<td><code>{_args_line(r['args'] or {}, 80)}</code></td>"
            f"<td class=outcome>{escape(str(r['outcome']))}</td><td>"
            f"{escape(', '.join(str(p.get('name')) for p in r['approved_by']))}</td>"
            f"<td>{escape(str(r['error'] or r['reason'] or ''))}</td></tr>"
            for r in rows
        )
        or '<tr><td colspan=7 class="muted">No exactcall call in this run yet.</td></tr>'
    )
    body = (
        f"<h1>Run <code>{escape(wf)}</code></h1><h2>Waiting</h2><table><tbody>"
        f"{pending_rows(pending)}</tbody></table><h2>Its calls (audit, read-only)</h2><table>"
        "<thead><tr><th>Time</th><th>Step</th><th>Tool</th><th>Arguments</th><th>Outcome</th>"
        f'<th>Approved by</th><th>Error / reason</th></tr></thead><tbody id="calls">{calls}'
        "</tbody></table>"
    )
    return _layout(wf, body, who, csrf)


def login_page(message: str = "") -> str:
    note = f'<p class="bad" id="login-error">{escape(message)}</p>' if message else ""
    body = (
        f"<h1>Sign in</h1>{note}<p>Paste the token you were given (<code>exactcall inbox token "
        "NAME</code> issues one). Your name comes from the token; the inbox never asks for it."
        '</p><form method="post" action="/login"><p><input type="password" name="token" '
        'autocomplete="off" id="token"></p><button type="submit" id="login">Sign in</button>'
        "</form>"
    )
    return _layout("Sign in", body)


def error_page(title: str, detail: str) -> str:
    return _layout(title, f'<h1>{escape(title)}</h1><p class="bad" id="error">{escape(detail)}</p>')
