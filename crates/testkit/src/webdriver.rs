//! A real browser for the tests: Debian's headless `chromium`, driven through Debian's
//! `chromedriver` by the W3C WebDriver protocol (JSON over HTTP on loopback).
//!
//! The browser is kept off every network but loopback: no name is resolved (the host resolver
//! maps every name to nothing), and Chromium's own background traffic (updates, sync, safe
//! browsing, metrics) is switched off. Only 127.0.0.1 is reachable, by its address.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use base64::Engine as _;
use serde_json::{Value, json};

/// The key W3C WebDriver gives an element reference under.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// A chromedriver process and one headless Chromium session; both end when this is dropped.
pub struct Browser {
    driver: Child,
    base: String,
    http: reqwest::blocking::Client,
    profile: tempfile::TempDir,
}

/// An element of the page, by its WebDriver reference.
pub struct Element<'a> {
    browser: &'a Browser,
    id: String,
}

/// The key WebDriver's "type" sends for Enter.
pub const ENTER: &str = "\u{E007}";

/// Where Debian puts the browser and its driver.
const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

impl Browser {
    /// Starts chromedriver on a loopback port of its choosing, and a headless Chromium session
    /// with a window of `width` × `height` pixels.
    pub fn start(width: u32, height: u32) -> Browser {
        for program in [CHROMIUM, CHROMEDRIVER] {
            assert!(
                Path::new(program).is_file(),
                "{program} is missing: bash scripts/install-tests (Debian's chromium and chromium-driver)"
            );
        }
        let mut driver = Command::new(CHROMEDRIVER)
            .args(["--port=0", "--allowed-ips=127.0.0.1"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(driver.stdout.take().unwrap()).lines();
        let port = loop {
            let line = lines
                .next()
                .expect("chromedriver said which port it took")
                .unwrap();
            if let Some(rest) = line.split("started successfully on port ").nth(1) {
                break rest.trim_end_matches('.').trim().to_owned();
            }
        };
        // Keep reading its output so that it never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines.map_while(Result::ok) {});
        let profile = tempfile::tempdir().unwrap();
        let mut browser = Browser {
            driver,
            base: format!("http://127.0.0.1:{port}/session"),
            http: reqwest::blocking::Client::new(),
            profile,
        };
        let args = [
            "--headless=new".to_owned(),
            // The tests run as root, where Chromium's own sandbox cannot start.
            "--no-sandbox".to_owned(),
            "--disable-dev-shm-usage".to_owned(),
            "--disable-gpu".to_owned(),
            format!("--window-size={width},{height}"),
            format!("--user-data-dir={}", browser.profile.path().display()),
            "--no-first-run".to_owned(),
            "--no-default-browser-check".to_owned(),
            "--disable-background-networking".to_owned(),
            "--disable-component-update".to_owned(),
            "--disable-sync".to_owned(),
            "--disable-default-apps".to_owned(),
            "--disable-domain-reliability".to_owned(),
            "--disable-client-side-phishing-detection".to_owned(),
            "--no-pings".to_owned(),
            "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1".to_owned(),
        ];
        let created = browser.call(
            reqwest::Method::POST,
            "",
            &json!({"capabilities": {"alwaysMatch": {
                "browserName": "chrome",
                "goog:chromeOptions": {"binary": CHROMIUM, "args": args},
                // A script may wait on the page (axe-core's checks, a reload) for a while.
                "timeouts": {"script": 120_000},
            }}}),
        );
        let session = created["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {created}"));
        browser.base = format!("{}/{session}", browser.base);
        browser
    }

    /// One WebDriver command; its `value`. Panics on an error, with WebDriver's message.
    fn call(&self, method: reqwest::Method, path: &str, body: &Value) -> Value {
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if !body.is_null() {
            request = request.json(body);
        }
        let response = request.send().unwrap();
        let status = response.status();
        let answer: Value = response.json().unwrap();
        assert!(
            status.is_success(),
            "WebDriver {path}: {status}: {}",
            answer["value"]["message"]
        );
        answer["value"].clone()
    }

    /// Runs `script` (a function body, given `args` as `arguments`) in the page; what it returns.
    pub fn execute(&self, script: &str, args: &[Value]) -> Value {
        self.call(
            reqwest::Method::POST,
            "/execute/sync",
            &json!({"script": script, "args": args}),
        )
    }

    /// [`Browser::execute`], with WebDriver's error handed back instead of a panic: a page being
    /// replaced by another (a reload) can end a script.
    pub fn try_execute(&self, script: &str, args: &[Value]) -> Result<Value, String> {
        let response = self
            .http
            .post(format!("{}/execute/sync", self.base))
            .json(&json!({"script": script, "args": args}))
            .send()
            .map_err(|e| e.to_string())?;
        let ok = response.status().is_success();
        let answer: Value = response.json().map_err(|e| e.to_string())?;
        if ok {
            Ok(answer["value"].clone())
        } else {
            Err(format!(
                "{}: {}",
                answer["value"]["error"], answer["value"]["message"]
            ))
        }
    }

    /// Runs `script` in the page until it calls its last argument (the callback WebDriver adds
    /// after `args`) with what it returns; at most two minutes.
    pub fn execute_async(&self, script: &str, args: &[Value]) -> Value {
        self.call(
            reqwest::Method::POST,
            "/execute/async",
            &json!({"script": script, "args": args}),
        )
    }

    /// Opens `url` and waits for it to load.
    pub fn go(&self, url: &str) {
        self.call(reqwest::Method::POST, "/url", &json!({ "url": url }));
    }

    /// The address of the page shown.
    pub fn url(&self) -> String {
        self.call(reqwest::Method::GET, "/url", &Value::Null)
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// The page's title.
    pub fn title(&self) -> String {
        self.call(reqwest::Method::GET, "/title", &Value::Null)
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// The page's markup as the browser holds it now.
    pub fn source(&self) -> String {
        self.call(reqwest::Method::GET, "/source", &Value::Null)
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// The page's text as a person reads it (the `body`'s rendered text).
    pub fn text(&self) -> String {
        self.find("body").text()
    }

    /// The first element `css` selects; panics when there is none.
    pub fn find(&self, css: &str) -> Element<'_> {
        self.try_find(css)
            .unwrap_or_else(|| panic!("nothing matches {css} in {}", self.url()))
    }

    /// The first element `css` selects, if any.
    pub fn try_find(&self, css: &str) -> Option<Element<'_>> {
        let response = self
            .http
            .post(format!("{}/element", self.base))
            .json(&json!({"using": "css selector", "value": css}))
            .send()
            .unwrap();
        if response.status() == reqwest::StatusCode::NOT_FOUND {
            return None;
        }
        let answer: Value = response.json().unwrap();
        let id = answer["value"][ELEMENT]
            .as_str()
            .unwrap_or_else(|| panic!("{css}: {answer}"));
        Some(Element {
            browser: self,
            id: id.to_owned(),
        })
    }

    /// The first element `css` selects once there is one: a click that submits a form or follows
    /// a link may return before the next page is there, so a test waits for what it expects on
    /// that page. Panics when nothing matches within 10 seconds.
    pub fn wait_for(&self, css: &str) -> Element<'_> {
        let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            if let Some(found) = self.try_find(css) {
                return found;
            }
            assert!(
                std::time::Instant::now() < until,
                "nothing matched {css} in 10 s; the page is {}:\n{}",
                self.url(),
                self.text()
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// Every element `css` selects.
    pub fn find_all(&self, css: &str) -> Vec<Element<'_>> {
        let found = self.call(
            reqwest::Method::POST,
            "/elements",
            &json!({"using": "css selector", "value": css}),
        );
        found
            .as_array()
            .unwrap()
            .iter()
            .map(|e| Element {
                browser: self,
                id: e[ELEMENT].as_str().unwrap().to_owned(),
            })
            .collect()
    }

    /// Saves what the browser shows as a PNG at `path`; the path.
    pub fn screenshot(&self, path: &Path) -> PathBuf {
        let encoded = self.call(reqwest::Method::GET, "/screenshot", &Value::Null);
        let png = base64::engine::general_purpose::STANDARD
            .decode(encoded.as_str().unwrap())
            .unwrap();
        assert!(png.starts_with(b"\x89PNG"), "the screenshot is no PNG");
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        std::fs::write(path, png).unwrap();
        path.to_owned()
    }
}

impl Element<'_> {
    fn path(&self, what: &str) -> String {
        format!("/element/{}{what}", self.id)
    }

    /// Types `text` into the element.
    pub fn type_text(&self, text: &str) {
        self.browser.call(
            reqwest::Method::POST,
            &self.path("/value"),
            &json!({ "text": text }),
        );
    }

    /// Clicks the element (and waits for a page it opens to load).
    pub fn click(&self) {
        self.browser
            .call(reqwest::Method::POST, &self.path("/click"), &json!({}));
    }

    /// The element's rendered text.
    pub fn text(&self) -> String {
        self.browser
            .call(reqwest::Method::GET, &self.path("/text"), &Value::Null)
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// An attribute's value, if the element has it.
    pub fn attribute(&self, name: &str) -> Option<String> {
        self.browser
            .call(
                reqwest::Method::GET,
                &self.path(&format!("/attribute/{name}")),
                &Value::Null,
            )
            .as_str()
            .map(str::to_owned)
    }

    /// The first element under this one that `css` selects.
    pub fn find(&self, css: &str) -> Element<'_> {
        let found = self.browser.call(
            reqwest::Method::POST,
            &self.path("/element"),
            &json!({"using": "css selector", "value": css}),
        );
        Element {
            browser: self.browser,
            id: found[ELEMENT].as_str().unwrap().to_owned(),
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // Ends the session (which stops Chromium), then the driver.
        let _ = self.http.delete(&self.base).send();
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
