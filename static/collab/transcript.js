// Where a session page opens (docs/web-app.md#reading-a-branch-on-the-session-page):
// - at the node its URL names (?head=…, or #m-<message id>): scrolled to it, its folded history
//   opened; a #m-… older than the page's rows reopens the page at that node (?head=…);
// - otherwise at the newest turn: the last row just above the composer.
// Live refreshes of the transcript never move the reader.
(function () {
  "use strict";

  function rows(transcript) {
    return Array.prototype.filter.call(transcript.querySelectorAll("article[data-message]"), function (row) {
      return row.offsetParent !== null;  // shown (not folded away in an inherited history)
    });
  }

  function scrollToNewest(transcript) {
    var shown = rows(transcript), running = document.getElementById("running");
    var last = running && !running.hidden ? running : shown[shown.length - 1];
    if (!last) return;
    var composer = document.getElementById("composer-box");
    var bottom = window.innerHeight - (composer ? composer.offsetHeight : 0) - 8;
    var overflow = last.getBoundingClientRect().bottom - bottom;
    if (overflow > 0) window.scrollBy(0, overflow);
  }

  function openNamed(id) {
    var node = document.getElementById(id);
    if (!node) return false;
    var folded = node.closest("details:not([open])");
    if (folded) folded.open = true;
    if (node.scrollIntoView) node.scrollIntoView({ block: "center" });
    return true;
  }

  document.addEventListener("DOMContentLoaded", function () {
    var transcript = document.getElementById("transcript");
    if (!transcript) return;
    var hash = window.location.hash, named = /^#m-([\w-]+)$/.exec(hash);
    if (named) {
      if (openNamed(hash.slice(1))) return;
      var url = new URL(window.location.href);
      if (!url.searchParams.get("head")) {  // not among the page's rows: open the page at it
        url.searchParams.set("head", named[1]);
        window.location.replace(url.toString());
      }
      return;
    }
    if (hash) return;  // another explicit #anchor wins
    var node = transcript.querySelector('[aria-current="location"]');
    if (node) {
      if (node.scrollIntoView) node.scrollIntoView({ block: "center" });
      return;
    }
    scrollToNewest(transcript);
  });
})();
