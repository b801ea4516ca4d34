// Live session page. The socket carries the session's JSON events (docs/contract.md#events);
// for each one the page fetches exactly the fragment that event changed — new transcript rows, one
// job/branch/agent row, the running indicator, a row whose card shows a job's state — and the
// server renders it, so the browser never decides what to show (a stopped turn's marker rides out
// of band on its job's row). Bursts coalesce per fragment; what a person is typing survives every swap.
(function () {
  "use strict";

  var ROW_DELAY = 100;      // ms: one fetch per fragment per burst
  var DELTA_DELAY = 250;    // ms: a streaming model's text, at most four times a second
  var ACTIVITY_DELAY = 1000;
  var JOBS_SHOWN = 20;      // as many job rows as the page renders (selectors.pages.recent_jobs)
  var SWAP = { swapDelay: 0, settleDelay: 0, ignoreTitle: true };

  function byId(id) { return document.getElementById(id); }

  function setLive(state, label) {
    var el = byId("live-status");
    if (!el) return;
    el.dataset.state = state;
    el.textContent = label;
  }

  // --- typed text survives swaps -------------------------------------------------------------

  // The fields (and open <details>) under `root`, keyed by the nearest element with an id and
  // their name, so the same field in the re-rendered HTML gets its value back.
  function fieldKey(el) {
    var owner = el.parentElement && el.parentElement.closest("[id]");
    return (owner ? owner.id : "") + "|" + el.tagName + "|" + (el.name || "") + "|" + (el.tagName === "DETAILS" ? el.className : "");
  }

  function snapshot(root) {
    var saved = { fields: {}, focus: null };
    if (!root || !root.querySelectorAll) return saved;
    root.querySelectorAll("input:not([type=hidden]), textarea, select, details[open]").forEach(function (el) {
      var key = fieldKey(el);
      if (el.tagName === "DETAILS") { saved.fields[key] = { open: true }; return; }
      if (el.value === el.defaultValue && el !== document.activeElement) return; // nothing typed
      saved.fields[key] = { value: el.value };
      if (el === document.activeElement) {
        saved.focus = { key: key, start: el.selectionStart, end: el.selectionEnd };
      }
    });
    return saved;
  }

  function restore(root, saved) {
    if (!root || !root.querySelectorAll || !Object.keys(saved.fields).length) return;
    root.querySelectorAll("input:not([type=hidden]), textarea, select, details").forEach(function (el) {
      var key = fieldKey(el), old = saved.fields[key];
      if (!old) return;
      if (el.tagName === "DETAILS") { el.open = !!old.open; return; }
      el.value = old.value;
      if (saved.focus && saved.focus.key === key) {
        el.focus({ preventScroll: true });
        try { el.setSelectionRange(saved.focus.start, saved.focus.end); } catch (err) { /* select */ }
      }
    });
  }

  // htmx's own swaps (the composer's answer, a cancel) keep typed text too.
  var pendingRestore = null;
  document.addEventListener("htmx:beforeSwap", function (e) {
    var target = e.detail.target;
    pendingRestore = target && target.id ? { id: target.id, saved: snapshot(target) } : null;
  });
  document.addEventListener("htmx:afterSwap", function () {
    if (pendingRestore) restore(byId(pendingRestore.id), pendingRestore.saved);
    pendingRestore = null;
    markShownLane();
  });
  // and so do out-of-band pieces (a transcript row that rides along with its job's row)
  var oobSaved = {};
  document.addEventListener("htmx:oobBeforeSwap", function (e) {
    var target = e.detail.target;
    if (target && target.id) oobSaved[target.id] = snapshot(target);
  });
  document.addEventListener("htmx:oobAfterSwap", function (e) {
    var target = e.detail.target, id = target && target.id;
    if (!id || !oobSaved[id]) return;
    restore(byId(id), oobSaved[id]);
    delete oobSaved[id];
  });

  // The graph marks the lane of the branch the transcript shows (the graph's HTML is the same
  // for every viewer and every selection, so the page marks it after each render).
  function markShownLane() {
    var transcript = byId("transcript"), shown = transcript ? transcript.dataset.branch : "";
    document.querySelectorAll("#dag .lane.shown").forEach(function (el) { el.classList.remove("shown"); });
    if (!shown) return;
    document.querySelectorAll("#dag .lane").forEach(function (el) {
      if (el.dataset.branch === shown) el.classList.add("shown");
    });
  }
  markShownLane();

  // Swap `html` at `target` with `style`, keeping typed text; out-of-band pieces are swapped by htmx.
  function swap(target, html, style) {
    var keepId = style === "outerHTML" ? target.id : null;
    var saved = snapshot(style === "outerHTML" ? target : null);
    htmx.swap(target, html, Object.assign({ swapStyle: style }, SWAP));
    if (keepId) restore(byId(keepId), saved);
    markShownLane();
  }

  // --- coalesced fetches ---------------------------------------------------------------------

  var jobs = {};  // key -> {timer, busy, again}
  var htmxInFlight = 0;

  // <body data-live-quiet="1"> when nothing is scheduled, fetching or being swapped: what an
  // event set off has all happened (tests wait for it instead of waiting a while).
  function markQuiet() {
    var quiet = htmxInFlight === 0 && Object.keys(jobs).every(function (k) { return !jobs[k].timer && !jobs[k].busy; });
    if (document.body) document.body.dataset.liveQuiet = quiet ? "1" : "0";
  }
  document.addEventListener("htmx:beforeRequest", function () { htmxInFlight++; markQuiet(); });
  document.addEventListener("htmx:afterRequest", function () { htmxInFlight = Math.max(0, htmxInFlight - 1); markQuiet(); });

  // Run `work` (which returns a promise) once after `delay` ms however often it is asked for;
  // asked again while it runs, it runs once more afterwards (it always reads the page afresh).
  function schedule(key, delay, work) {
    var job = jobs[key] || (jobs[key] = { timer: null, busy: false, again: false });
    if (job.busy) { job.again = true; return; }
    if (job.timer) return;
    job.timer = setTimeout(function run() {
      job.timer = null;
      job.busy = true;
      job.again = false;
      Promise.resolve().then(work).catch(function () { /* the next event or reconnect retries */ })
        .then(function () {
          job.busy = false;
          if (job.again) { job.again = false; job.timer = setTimeout(run, delay); }
          markQuiet();
        });
    }, delay);
    markQuiet();
  }
  markQuiet();

  function get(url) {
    return fetch(url, { credentials: "same-origin", headers: { "HX-Request": "true" } }).then(function (r) {
      return r.text().then(function (text) { return { status: r.status, ok: r.ok, text: text }; });
    });
  }

  function withParams(url, params) {
    var q = Object.keys(params).filter(function (k) { return params[k]; })
      .map(function (k) { return encodeURIComponent(k) + "=" + encodeURIComponent(params[k]); }).join("&");
    return q ? url + (url.indexOf("?") >= 0 ? "&" : "?") + q : url;
  }

  // The rows contract with templates/collab/_message.html: each row carries data-message and id m-<id>.
  function lastRow(transcript) {
    var rows = transcript.querySelectorAll("article[data-message]");
    for (var i = rows.length - 1; i >= 0; i--) {
      if (!rows[i].closest("#running")) return rows[i];
    }
    return null;
  }

  // New rows of the shown branch: "after the last row on the page", so a repeated or replayed
  // event appends nothing twice and a missed one leaves no hole.
  function appendRows() {
    var transcript = byId("transcript");
    if (!transcript || !transcript.dataset.branch) return;
    var last = lastRow(transcript), after = last ? last.dataset.message : "";
    return get(withParams(transcript.dataset.rows, { branch: transcript.dataset.branch, after: after })).then(function (r) {
      var now = lastRow(transcript);
      if (byId("transcript") !== transcript || (now ? now.dataset.message : "") !== after) {
        schedule("rows", ROW_DELAY, appendRows);  // the transcript changed meanwhile: ask again
        return;
      }
      if (r.status === 409) return reloadTranscript();
      if (!r.ok) return;
      var empty = transcript.querySelector(".empty");
      if (empty && r.text.indexOf("data-message") >= 0) empty.remove();
      // the running indicator comes out of band; the rows go right after the last one
      if (last) swap(last, r.text, "afterend"); else swap(transcript, r.text, "beforeend");
      var running = byId("running");
      if (running && running.parentElement === transcript) transcript.appendChild(running);
    });
  }

  function reloadTranscript() {
    var transcript = byId("transcript");
    return get(transcript.dataset.reload).then(function (r) {
      if (r.ok && byId("transcript")) swap(byId("transcript"), r.text, "outerHTML");
    });
  }

  function patchRunning() {
    var transcript = byId("transcript");
    if (!transcript || !transcript.dataset.branch) return;
    return get(withParams(transcript.dataset.running, { branch: transcript.dataset.branch })).then(function (r) {
      var running = byId("running");
      if (r.ok && running) swap(running, r.text, "outerHTML");
    });
  }

  function patchMessage(id) {
    var row = byId("m-" + id), session = byId("session"), transcript = byId("transcript");
    if (!row) return;
    var url = "/s/" + encodeURIComponent(session.dataset.session) + "/m/" + encodeURIComponent(id) + "/row";
    return get(withParams(url, { branch: transcript ? transcript.dataset.branch : "" })).then(function (r) {
      var now = byId("m-" + id);
      if (r.ok && now) swap(now, r.text, "outerHTML");
    });
  }

  // One row of a side list: replaced where it is, or added (`place` puts a new one).
  function patchRow(listOwner, id, rowId, params, place) {
    var owner = byId(listOwner);
    if (!owner) return;
    return get(withParams(owner.dataset.row + "/" + encodeURIComponent(id), params || {})).then(function (r) {
      if (!r.ok) return;
      var existing = byId(rowId);
      if (existing) { swap(existing, r.text, "outerHTML"); return; }
      var list = owner.querySelector("ul");
      if (list) place(list, r.text);
    });
  }

  function addJob(list, html) {
    var empty = list.querySelector(":scope > .empty");
    if (empty) empty.remove();
    swap(list, html, "afterbegin");
    var rows = list.querySelectorAll(":scope > li.job");
    for (var i = JOBS_SHOWN; i < rows.length; i++) rows[i].remove();
  }

  function addBranch(list, html) {
    var firstArchived = list.querySelector(":scope > li.archived");
    if (firstArchived) swap(firstArchived, html, "beforebegin"); else swap(list, html, "beforeend");
  }

  function addAgent(list, html) {
    var heading = byId("agents").querySelector("h2");
    if (heading) heading.hidden = false;
    swap(list, html, "beforeend");
    // the rail is ordered by task name, as the page renders it
    Array.prototype.slice.call(list.querySelectorAll(":scope > li.agent"))
      .sort(function (a, b) { return a.dataset.agent < b.dataset.agent ? -1 : a.dataset.agent > b.dataset.agent ? 1 : 0; })
      .forEach(function (li) { list.appendChild(li); });
  }

  // The transcript rows whose card shows job `job`'s state (a spawn's pointer, a delivered task's
  // or a result's card: data-card-job), each re-rendered where it is.
  function patchCards(job) {
    var transcript = byId("transcript");
    if (!transcript) return;
    transcript.querySelectorAll('[data-card-job="' + CSS.escape(job) + '"]').forEach(function (el) {
      var row = el.closest("article[data-message]");
      if (!row || row.closest("#running")) return;
      var id = row.dataset.message;
      schedule("m:" + id, ROW_DELAY, function () { return patchMessage(id); });
    });
  }

  function refreshActivity() { htmx.trigger(document.body, "collab:activity"); }
  // The plots (templates/collab/_stats.html): three aggregates over the session's jobs.
  function refreshStats() { if (byId("session-stats")) htmx.trigger(document.body, "collab:stats"); }
  // The DAG column's newest block re-renders itself (bounded: templates/collab/_dag_page.html).
  function refreshDag() { if (byId("dag-live")) htmx.trigger(document.body, "collab:dag"); }

  // --- what each event changes ---------------------------------------------------------------

  function apply(event) {
    var p = event.payload || {}, type = event.type || "";
    var transcript = byId("transcript");
    var shown = transcript ? transcript.dataset.branch : "";
    var sid = byId("session").dataset.session;
    if (type === "message.created") {
      if (p.kind === "attach") {
        if (p.predecessor && byId("m-" + p.predecessor)) {
          schedule("m:" + p.predecessor, ROW_DELAY, function () { return patchMessage(p.predecessor); });
        }
      } else if (p.branch && p.branch === shown) {
        schedule("rows", ROW_DELAY, appendRows);
      }
    } else if (type === "message.delta") {
      if (p.branch && p.branch === shown) schedule("running", DELTA_DELAY, patchRunning);
    } else if (type.indexOf("job.") === 0 && p.job) {
      schedule("job:" + p.job, ROW_DELAY, function () {
        return patchRow("jobs", p.job, "job-" + p.job, { branch: shown }, addJob);
      });
    } else if (type.indexOf("branch.") === 0 && p.branch) {
      schedule("branch:" + p.branch, ROW_DELAY, function () {
        return patchRow("branches", p.branch, "branch-" + p.branch, { shown: shown }, addBranch);
      });
    } else if ((type === "child.job" || (type === "agent.spawned" && p.toolset === "openwork")) && p.session && p.session !== sid) {
      schedule("agent:" + p.session, ROW_DELAY, function () {
        return patchRow("agents", p.session, "agent-" + p.session, {}, addAgent);
      });
    }
    // a job's change (or a sub-agent session's: child.job) shows on the cards that follow that job
    // and in the plots
    var jobChange = type.indexOf("job.") === 0 || type === "child.job";
    if (jobChange && p.job) patchCards(p.job);
    if (type !== "message.delta") schedule("activity", ACTIVITY_DELAY, refreshActivity);
    if (jobChange) schedule("stats", ACTIVITY_DELAY, refreshStats);
    if (type === "message.created" || type.indexOf("branch.") === 0 || type.indexOf("job.") === 0) {
      schedule("dag", ACTIVITY_DELAY, refreshDag);
    }
  }

  // --- the socket ----------------------------------------------------------------------------

  // One socket per page, reopened after any close with ?after=<the last seq applied>: the server
  // replays exactly the gap, and a frame at or below that seq is ignored.
  function follow(root) {
    var lastSeq = parseInt(root.dataset.lastSeq, 10) || 0;
    var retry = 0;

    function open() {
      if (!byId("session")) return;
      var url = (location.protocol === "https:" ? "wss://" : "ws://") + location.host + root.dataset.live + "?after=" + lastSeq;
      var socket;
      try { socket = new WebSocket(url); } catch (err) { return later(); }
      setLive("connecting", retry ? "reconnecting…" : "connecting…");
      socket.onopen = function () { retry = 0; setLive("live", "live"); };
      socket.onmessage = function (e) {
        var event;
        try { event = JSON.parse(e.data); } catch (err) { return; }
        if (typeof event.seq !== "number" || event.seq <= lastSeq) return;
        lastSeq = event.seq;
        root.dataset.lastSeq = String(lastSeq);
        document.body.dispatchEvent(new CustomEvent("collab:event", { detail: event }));
        apply(event);
      };
      socket.onclose = function (e) {
        if (e.code === 4401 || e.code === 4403) { setLive("offline", "disconnected"); return; }  // access ended
        setLive("offline", "reconnecting…");
        later();
      };
    }

    function later() {
      retry += 1;
      setTimeout(open, Math.min(500 * retry, 5000));
    }

    open();
  }

  document.addEventListener("DOMContentLoaded", function () {
    var root = byId("session");
    if (root && root.dataset.live && window.WebSocket) follow(root);
  });

  // --- the composer --------------------------------------------------------------------------

  document.addEventListener("htmx:responseError", function (e) {
    var box = byId("composer-error");
    if (box && e.detail.elt && e.detail.elt.id === "composer") {
      box.textContent = e.detail.xhr.responseText || ("Error " + e.detail.xhr.status);
    }
  });
  // the composer empties after a turn was accepted (no inline handler: the CSP allows none)
  document.addEventListener("htmx:afterRequest", function (e) {
    var form = e.detail.elt;
    if (form && form.id === "composer" && e.detail.successful) form.reset();
  });
  document.addEventListener("htmx:beforeRequest", function (e) {
    var box = byId("composer-error");
    if (box && e.detail.elt && e.detail.elt.id === "composer") box.textContent = "";
  });
})();
