// Live session page: the socket carries JSON events (SPEC §11.1); the page re-renders
// the affected partials from the server, so the browser never decides what to show.
(function () {
  "use strict";
  var pending = null;

  function refreshSoon() {
    if (pending) return;
    pending = setTimeout(function () {
      pending = null;
      htmx.trigger(document.body, "collab:refresh");
    }, 60);
  }

  function setLive(state, label) {
    var el = document.getElementById("live-status");
    if (!el) return;
    el.dataset.state = state;
    el.textContent = label;
  }

  document.addEventListener("htmx:wsBeforeMessage", function (e) {
    e.preventDefault(); // JSON events, not HTML to swap
    var event;
    try { event = JSON.parse(e.detail.message); } catch (err) { return; }
    var root = document.getElementById("session");
    if (root) root.dataset.lastSeq = event.seq;
    document.body.dispatchEvent(new CustomEvent("collab:event", { detail: event }));
    refreshSoon();
  });

  document.addEventListener("htmx:wsOpen", function () { setLive("live", "live"); refreshSoon(); });
  document.addEventListener("htmx:wsClose", function () { setLive("offline", "reconnecting…"); });

  document.addEventListener("htmx:responseError", function (e) {
    var box = document.getElementById("composer-error");
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
    var box = document.getElementById("composer-error");
    if (box && e.detail.elt && e.detail.elt.id === "composer") box.textContent = "";
  });
})();
