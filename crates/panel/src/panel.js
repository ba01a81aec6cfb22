// The panel's one script, served at /panel.js (the page's policy runs no other). A page that asks
// to reload itself (`#reload`, with `data-every` seconds) does so until the reader presses
// "Pause refresh"; the choice holds for the tab (sessionStorage), across reloads, until "Resume
// refresh". Without this script such a page never reloads by itself: its "Refresh" link does.
(function () {
  "use strict";
  var bar = document.getElementById("reload");
  if (!bar) {
    return;
  }
  var every = Number(bar.getAttribute("data-every"));
  var button = bar.querySelector("button");
  var state = bar.querySelector(".reload-state");
  if (!(every > 0) || !button || !state) {
    return;
  }
  var key = "pi-panel-refresh-paused";
  var timer = null;
  // Storage may be refused (a private window, a policy): then the pause lasts for this page only.
  var paused = false;
  try {
    paused = window.sessionStorage.getItem(key) === "1";
  } catch (e) {
    paused = false;
  }

  function remember() {
    try {
      if (paused) {
        window.sessionStorage.setItem(key, "1");
      } else {
        window.sessionStorage.removeItem(key);
      }
    } catch (e) {
      // Kept in this page only.
    }
  }

  function show() {
    if (timer !== null) {
      window.clearTimeout(timer);
      timer = null;
    }
    if (!paused) {
      timer = window.setTimeout(function () {
        window.location.reload();
      }, every * 1000);
    }
    button.textContent = paused ? "Resume refresh" : "Pause refresh";
    state.textContent = paused ? "Refresh paused" : "Reloads every " + every + " s";
  }

  button.addEventListener("click", function () {
    paused = !paused;
    remember();
    show();
  });
  state.hidden = false;
  button.hidden = false;
  show();
})();
