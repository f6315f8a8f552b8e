// meshminer status page: live updates over server-sent events, copy buttons, job submit.
// The server renders every part of the page; this script only fetches a part again
// (its data-live URL, which renders just that part) when an event concerns it.
"use strict";
(function () {
  const MIN_INTERVAL_MS = 300;
  const conn = document.getElementById("conn");
  let source = null;
  let greeted = false;
  let retryMs = 1000;

  function setConn(state, text) {
    if (!conn) return;
    conn.dataset.state = state;
    conn.textContent = text;
  }

  function regions() {
    return Array.from(document.querySelectorAll("[data-live]"));
  }

  async function refresh(el) {
    if (el._busy) { el._again = true; return; }
    el._busy = true;
    el._last = Date.now();
    try {
      const response = await fetch(el.dataset.live, { cache: "no-store", headers: { Accept: "text/html" } });
      const html = response.ok ? await response.text() : null;
      // the same part again is left alone: a link or button under the pointer stays the one clicked
      if (html !== null && html !== el._html) {
        el.innerHTML = html;
        el._html = html;
        el.dataset.version = String(Number(el.dataset.version || "0") + 1);
      }
    } catch (err) {
      // the node is unreachable for now; the next event or reconnect fetches again
    } finally {
      el._busy = false;
      if (el._again) { el._again = false; schedule(el); }
    }
  }

  function schedule(el) {
    if (el._timer) return;
    const every = Number(el.dataset.liveEveryMs || MIN_INTERVAL_MS);
    const wait = Math.max(0, (el._last || 0) + every - Date.now());
    el._timer = setTimeout(() => { el._timer = null; refresh(el); }, wait);
  }

  function refreshAll() { regions().forEach(schedule); }

  function onEvent(kind, data) {
    for (const el of regions()) {
      const kinds = (el.dataset.liveOn || "").split(/\s+/);
      if (!kinds.includes(kind)) continue;
      // a job's page follows that job only (a ledger entry names it as job_id)
      if (el.dataset.liveJob && data && (data.id || data.job_id) !== el.dataset.liveJob) continue;
      schedule(el);
    }
  }

  function connect() {
    source = new EventSource("/api/v1/events");
    source.addEventListener("hello", (e) => {
      retryMs = 1000;
      setConn("live", "live");
      document.body.dataset.boot = JSON.parse(e.data).boot;
      if (greeted) refreshAll();  // reconnected (maybe to a restarted node): catch up
      greeted = true;
    });
    for (const kind of ["job", "peer", "ledger", "status", "tick"]) {
      source.addEventListener(kind, (e) => {
        let data = null;
        try { data = JSON.parse(e.data); } catch (err) { /* keep going */ }
        onEvent(kind, data);
      });
    }
    source.addEventListener("lagged", refreshAll);
    source.onerror = () => {
      setConn("reconnecting", "reconnecting…");
      if (source.readyState === EventSource.CLOSED) {  // the browser gave up: start over
        setTimeout(connect, retryMs);
        retryMs = Math.min(retryMs * 2, 10000);
      }
    };
  }

  function copyText(text, button) {
    const done = () => {
      button.classList.add("copied");
      button.textContent = "copied";
      setTimeout(() => { button.classList.remove("copied"); button.textContent = "copy"; }, 1500);
    };
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(done, () => fallbackCopy(text, done));
    } else {
      fallbackCopy(text, done);
    }
  }

  function fallbackCopy(text, done) {
    const area = document.createElement("textarea");
    area.value = text;
    document.body.appendChild(area);
    area.select();
    try { document.execCommand("copy"); done(); } catch (err) { /* nothing more to try */ }
    area.remove();
  }

  function setupCopy() {
    document.addEventListener("click", (e) => {
      const button = e.target.closest("button.copy");
      if (button) copyText(button.dataset.copy || "", button);
    });
  }

  function tokenHeaders() {
    const token = document.getElementById("token");
    const value = token ? token.value.trim() : "";
    if (!value) return {};
    sessionStorage.setItem("meshminer-token", value);
    return { Authorization: "Bearer " + value };
  }

  function setupCancel() {
    const token = document.getElementById("token");
    if (token && !token.value) token.value = sessionStorage.getItem("meshminer-token") || "";
    document.addEventListener("click", async (e) => {
      const button = e.target.closest("button[data-cancel]");
      if (!button) return;
      const result = document.getElementById("action-result");
      button.disabled = true;
      let response, answer;
      try {
        response = await fetch("/api/v1/jobs/" + encodeURIComponent(button.dataset.cancel) + "/cancel",
          { method: "POST", headers: tokenHeaders() });
        answer = await response.json();
      } catch (err) {
        answer = { error: "the node did not answer: " + err };
      }
      if (response && response.ok) {
        result.className = "ok";
        result.textContent = "cancelled";
      } else {
        button.disabled = false;
        result.className = "error";
        result.textContent = (response ? response.status + ": " : "") + (answer.error || "");
      }
    });
  }

  function setupSubmit() {
    const form = document.getElementById("submit-form");
    if (!form) return;
    const spec = document.getElementById("spec");
    const specFile = document.getElementById("spec-file");
    const dataFile = document.getElementById("data-file");
    const token = document.getElementById("token");
    const result = document.getElementById("submit-result");
    if (token) token.value = sessionStorage.getItem("meshminer-token") || "";
    specFile.addEventListener("change", async () => {
      if (specFile.files.length) spec.value = await specFile.files[0].text();
    });
    form.addEventListener("submit", async (e) => {
      e.preventDefault();
      const body = new FormData();
      body.append("spec", spec.value);
      if (dataFile.files.length) body.append("data", dataFile.files[0], dataFile.files[0].name);
      const headers = tokenHeaders();
      result.className = "";
      result.textContent = "submitting…";
      let response, answer;
      try {
        response = await fetch("/api/v1/jobs", { method: "POST", body, headers });
        answer = await response.json();
      } catch (err) {
        result.className = "error";
        result.textContent = "the node did not answer: " + err;
        return;
      }
      if (response.status === 201) {
        result.className = "ok";
        result.textContent = "submitted: job " + answer.id;
        window.location.assign("/jobs/" + encodeURIComponent(answer.id));
      } else {
        result.className = "error";
        result.textContent = response.status + ": " + (answer.error || response.statusText);
      }
    });
  }

  async function putPolicy(body, result) {
    result.className = "";
    result.textContent = "saving…";
    let response, answer;
    try {
      response = await fetch("/api/v1/policy", {
        method: "PUT",
        body: JSON.stringify(body),
        headers: Object.assign({ "Content-Type": "application/json" }, tokenHeaders()),
      });
      answer = await response.json();
    } catch (err) {
      result.className = "error";
      result.textContent = "the node did not answer: " + err;
      return false;
    }
    if (!response.ok) {
      result.className = "error";
      result.textContent = response.status + ": " + (answer.error || response.statusText);
      return false;
    }
    result.className = "ok";
    result.textContent = "saved: " + Object.keys(body).filter((k) => k !== "running").join(", ");
    return true;
  }

  // Only the fields the volunteer changed are sent; the node checks each and says
  // which one it refused.
  function setupPreferences() {
    const form = document.getElementById("preferences-form");
    if (!form) return;
    const result = document.getElementById("preferences-result");
    const token = document.getElementById("token");
    if (token) token.value = sessionStorage.getItem("meshminer-token") || "";
    form.addEventListener("submit", async (e) => {
      e.preventDefault();
      const body = {};
      for (const field of form.querySelectorAll("input[name], textarea[name]")) {
        if (field.type === "checkbox") {
          if (field.checked !== field.defaultChecked) body[field.name] = field.checked;
          continue;
        }
        if (field.value === field.defaultValue) continue;
        body[field.name] = field.type === "number" ? Number(field.value) : field.value;
      }
      if (!Object.keys(body).length) {
        result.className = "";
        result.textContent = "nothing changed";
        return;
      }
      if (await putPolicy(body, result)) {
        for (const field of form.querySelectorAll("input[name], textarea[name]")) {
          field.defaultValue = field.value;
          field.defaultChecked = field.checked;
        }
      }
    });
    const steer = {
      pause: { accepting: false },
      resume: { accepting: true },
      hand_back: { accepting: false, running: "hand_back" },
    };
    document.addEventListener("click", (e) => {
      const button = e.target.closest("button[data-steer]");
      if (button) putPolicy(steer[button.dataset.steer], result);
    });
  }

  setupCopy();
  setupSubmit();
  setupCancel();
  setupPreferences();
  if (window.EventSource) connect(); else setConn("connecting", "no live updates in this browser");
})();
