// Reading a branch: a page opened at a node (?head=…) scrolls to it once.
// Live refreshes of the transcript never move the reader.
(function () {
  "use strict";
  document.addEventListener("DOMContentLoaded", function () {
    if (window.location.hash) return; // an explicit #anchor wins
    var node = document.querySelector('#transcript [aria-current="location"]');
    if (node && node.scrollIntoView) node.scrollIntoView({ block: "center" });
  });
})();
