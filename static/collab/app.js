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
  function refreshInbox() { if (byId("needs-you")) htmx.trigger(document.body, "collab:inbox"); }

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
    // an ask made or decided, a delivery held or decided: the header's "Needs you" count reads
    // again now, not at its next poll (templates/collab/_needs_you_link.html)
    if (/^(approval|question|ask|delivery)\./.test(type)) schedule("inbox", ROW_DELAY, refreshInbox);
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

  // --- the fork popover ----------------------------------------------------------------------

  // Escape closes an open fork form (a <details> under its "Fork" button) and gives the button focus.
  document.addEventListener("keydown", function (e) {
    if (e.key !== "Escape") return;
    var open = e.target.closest && e.target.closest("details.fork[open]");
    if (!open) return;
    open.open = false;
    var summary = open.querySelector("summary");
    if (summary) summary.focus();
  });

  // --- replay (?at=N): the page as it was at event N of the session's log ---------------------

  // Each step fetches the page at that event and swaps in the pieces a replay shows; the URL
  // follows (replaceState), so a reload or a copied link opens the same moment.
  var REPLAY_PARTS = ["replay", "dag", "transcript", "branches", "jobs", "activity"];
  var PLAY_DELAY = 1200;  // ms each event stays on screen while playing: time to read what changed
  var replayTicket = 0, playing = false, playTimer = null, slideTimer = null;

  function replayBox() { return byId("replay"); }

  function replayUrl(n) {
    var box = replayBox();
    return box.dataset.url + "?at=" + n + (box.dataset.keep || "");
  }

  function nearBottom() {
    var doc = document.scrollingElement || document.documentElement;
    return window.innerHeight + window.scrollY >= doc.scrollHeight - 40;
  }

  function replayGo(n, focusId) {
    var box = replayBox();
    if (!box) return Promise.resolve();
    n = Math.max(1, Math.min(parseInt(box.dataset.last, 10), n));
    var url = replayUrl(n), ticket = ++replayTicket, stick = nearBottom();
    if (document.body) document.body.dataset.replayBusy = "1";
    return fetch(url, { credentials: "same-origin" }).then(function (r) {
      if (!r.ok) throw new Error("HTTP " + r.status);
      return r.text();
    }).then(function (html) {
      if (ticket !== replayTicket) return;
      var doc = new DOMParser().parseFromString(html, "text/html");
      var active = document.activeElement, keep = focusId || (active && active.id) || "";
      REPLAY_PARTS.forEach(function (id) {
        var now = byId(id), next = doc.getElementById(id);
        if (!now || !next) return;
        next = document.importNode(next, true);
        now.replaceWith(next);
        if (window.htmx) htmx.process(next);
      });
      history.replaceState(null, "", url);
      markShownLane();
      applyDagWidth();
      setUpReplay();
      if (keep && byId(keep)) byId(keep).focus({ preventScroll: true });
      if (stick) window.scrollTo(0, (document.scrollingElement || document.documentElement).scrollHeight);
    }).catch(function () {
      if (ticket === replayTicket) window.location.assign(url);  // the plain page: what the link would open
    }).then(function () {
      if (ticket === replayTicket && document.body) delete document.body.dataset.replayBusy;
    });
  }

  function setPlaying(on) {
    if (playing && !on) {  // a step the play had asked for and not shown yet is dropped
      replayTicket++;
      if (document.body) delete document.body.dataset.replayBusy;
    }
    playing = on;
    clearTimeout(playTimer);
    setUpReplay();
    if (!on) return;
    var box = replayBox();
    if (box && parseInt(box.dataset.at, 10) >= parseInt(box.dataset.last, 10)) {
      replayGo(1).then(function () { playTimer = setTimeout(playNext, PLAY_DELAY); });  // from the start again
    } else {
      playTimer = setTimeout(playNext, 250);
    }
  }

  function playNext() {
    var box = replayBox();
    if (!playing || !box) return;
    var at = parseInt(box.dataset.at, 10), last = parseInt(box.dataset.last, 10);
    if (at >= last) { setPlaying(false); return; }
    replayGo(at + 1).then(function () {
      if (!playing) return;
      if (parseInt(replayBox().dataset.at, 10) >= last) setPlaying(false);
      else playTimer = setTimeout(playNext, PLAY_DELAY);
    });
  }

  // The controls as the script drives them: play shown (and pressed while playing), "go" not needed.
  function setUpReplay() {
    var play = byId("replay-play"), go = byId("replay-go");
    if (go) go.hidden = true;
    if (!play) return;
    play.hidden = false;
    play.setAttribute("aria-pressed", playing ? "true" : "false");
    play.textContent = playing ? "❚❚ pause" : "▶ play";
    play.title = playing ? "Pause the replay" : "Play the session's events one after another";
  }

  document.addEventListener("click", function (e) {
    var step = e.target.closest && e.target.closest("a[data-replay-to]");
    if (step && replayBox() && !e.ctrlKey && !e.metaKey && !e.shiftKey && e.button === 0) {
      e.preventDefault();
      setPlaying(false);
      replayGo(parseInt(step.dataset.replayTo, 10), step.id);
      return;
    }
    if (e.target.closest && e.target.closest("#replay-play")) setPlaying(!playing);
  });
  document.addEventListener("input", function (e) {
    if (e.target.id !== "replay-at") return;
    var where = byId("replay-where"), last = replayBox().dataset.last;
    if (where) where.textContent = "event " + e.target.value;
    e.target.setAttribute("aria-valuetext", "event " + e.target.value + " of " + last);
  });
  document.addEventListener("change", function (e) {
    if (e.target.id !== "replay-at") return;
    setPlaying(false);
    var value = parseInt(e.target.value, 10);
    clearTimeout(slideTimer);
    slideTimer = setTimeout(function () { replayGo(value, "replay-at"); }, 150);  // a run of arrow keys: one load
  });
  document.addEventListener("submit", function (e) {
    if (!e.target.classList || !e.target.classList.contains("replay-controls")) return;
    e.preventDefault();
    var slider = byId("replay-at");
    if (slider) replayGo(parseInt(slider.value, 10), "replay-at");
  });
  document.addEventListener("DOMContentLoaded", function () { if (replayBox()) setUpReplay(); });

  // --- the graph column: its width, and its labels in full ------------------------------------

  // Wide screens put the graph beside the transcript; its width is dragged (or keyed: Left and
  // Right) on the handle at its right edge, and remembered in this browser.
  var DAG_WIDTH_KEY = "trellis.dag-width", DAG_MIN = 240, DAG_KEY_STEP = 32;
  var dragging = null;

  function dagMax() {
    var session = byId("session");
    return Math.max(DAG_MIN + 40, Math.round((session ? session.clientWidth : 1200) * 0.6));
  }

  // The handle says the column's width to assistive technology (a focusable separator's value).
  function markHandle(px) {
    var handle = document.querySelector("#dag .dag-resize");
    if (!handle) return;
    handle.setAttribute("aria-valuemin", String(DAG_MIN));
    handle.setAttribute("aria-valuemax", String(dagMax()));
    handle.setAttribute("aria-valuenow", String(Math.round(px)));
  }

  function setDagWidth(px, save) {
    var session = byId("session");
    if (!session || !isFinite(px)) return;
    px = Math.round(Math.max(DAG_MIN, Math.min(dagMax(), px)));
    session.style.setProperty("--dag-w", px + "px");  // CSSOM, which the CSP allows (no style attribute in markup)
    markHandle(px);
    if (save) {
      try { localStorage.setItem(DAG_WIDTH_KEY, String(px)); } catch (err) { /* storage off: this page only */ }
    }
  }

  function applyDagWidth() {
    var stored = null, dag = byId("dag");
    if (!dag) return;
    try { stored = localStorage.getItem(DAG_WIDTH_KEY); } catch (err) { /* storage off */ }
    if (stored) setDagWidth(parseInt(stored, 10), false);
    else markHandle(dag.getBoundingClientRect().width);
  }

  document.addEventListener("pointerdown", function (e) {
    var handle = e.target.closest && e.target.closest("#dag .dag-resize");
    if (!handle) return;
    e.preventDefault();
    dragging = { handle: handle, left: byId("dag").getBoundingClientRect().left };
    handle.classList.add("dragging");
    try { handle.setPointerCapture(e.pointerId); } catch (err) { /* not capturable */ }
  });
  document.addEventListener("pointermove", function (e) {
    if (dragging) setDagWidth(e.clientX - dragging.left, false);
  });
  document.addEventListener("pointerup", function (e) {
    if (!dragging) return;
    dragging.handle.classList.remove("dragging");
    setDagWidth(e.clientX - dragging.left, true);
    dragging = null;
  });
  document.addEventListener("keydown", function (e) {
    var handle = e.target.closest && e.target.closest("#dag .dag-resize");
    if (!handle) return;
    var now = byId("dag").getBoundingClientRect().width;
    var to = { ArrowLeft: now - DAG_KEY_STEP, ArrowRight: now + DAG_KEY_STEP, Home: DAG_MIN, End: dagMax() }[e.key];
    if (to === undefined) return;
    e.preventDefault();
    setDagWidth(to, true);
  });
  document.addEventListener("DOMContentLoaded", applyDagWidth);

  // A node's label is cut to fit its row; its whole text (and its branch, role and time) shows
  // beside it on hover and on keyboard focus — the same text as its <title>, its accessible name.
  var tip = null;

  function showTip(node) {
    var title = node.querySelector("title");
    if (!title) return;
    if (!tip) {
      tip = document.createElement("div");
      tip.id = "dag-tip";
      tip.className = "dag-tip";
      tip.setAttribute("role", "tooltip");
      document.body.appendChild(tip);
    }
    tip.textContent = title.textContent;
    tip.hidden = false;
    var r = node.getBoundingClientRect();
    var left = Math.min(r.left, window.innerWidth - tip.offsetWidth - 8);
    var top = r.bottom + 4 + tip.offsetHeight > window.innerHeight ? r.top - tip.offsetHeight - 4 : r.bottom + 4;
    tip.style.left = Math.max(4, Math.round(left)) + "px";
    tip.style.top = Math.max(4, Math.round(top)) + "px";
  }

  function hideTip() { if (tip) tip.hidden = true; }

  function tipNode(e) { return e.target.closest && e.target.closest("#dag [data-node]"); }
  document.addEventListener("mouseover", function (e) { var node = tipNode(e); if (node) showTip(node); });
  document.addEventListener("mouseout", function (e) {
    var node = tipNode(e);
    if (node && !(e.relatedTarget && node.contains(e.relatedTarget))) hideTip();
  });
  document.addEventListener("focusin", function (e) { var node = tipNode(e); if (node) showTip(node); else hideTip(); });
  document.addEventListener("focusout", function (e) { if (tipNode(e)) hideTip(); });
  document.addEventListener("keydown", function (e) { if (e.key === "Escape") hideTip(); });
  document.addEventListener("scroll", hideTip, true);

  // A waiting node's controls below the graph (templates/collab/_dag_asks.html): while a person
  // points at or is in a card, its node in the graph is marked too.
  function markAskNode(e, on) {
    var card = e.target.closest && e.target.closest("#dag .dag-ask[data-ask-node]");
    if (!card) return;
    document.querySelectorAll("#dag [data-node]").forEach(function (node) {
      if (node.dataset.node === card.dataset.askNode) node.classList.toggle("ask-focus", on);
    });
  }
  document.addEventListener("focusin", function (e) { markAskNode(e, true); });
  document.addEventListener("focusout", function (e) { markAskNode(e, false); });
  document.addEventListener("mouseover", function (e) { markAskNode(e, true); });
  document.addEventListener("mouseout", function (e) { markAskNode(e, false); });
})();
