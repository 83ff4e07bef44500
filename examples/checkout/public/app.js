// The checkout page. The intent id is made once, when the customer opens the checkout, and kept in
// sessionStorage: a reload, a second click or a retry after the network came back is the same
// intent, so the backend sends orderpay the same keys. Only the UUID leaves the browser.
"use strict";

const INTENT = "checkout-intent";
const PAYING = "checkout-paying";
let intent = sessionStorage.getItem(INTENT);
if (!intent) {
  intent = crypto.randomUUID();
  sessionStorage.setItem(INTENT, intent);
}

const stateLine = document.getElementById("state");
const payButton = document.getElementById("pay");

function show(state, text) {
  stateLine.dataset.state = state;
  stateLine.textContent = text;
}

function render(answer) {
  document.getElementById("total").textContent = answer.total;
  stateLine.dataset.orderId = answer.order_id;
  if (answer.order_status === "paid") {
    sessionStorage.removeItem(PAYING);
    payButton.disabled = true;
    return show("paid", `Paid: order ${answer.order_id}, payment ${answer.payment_id}`);
  }
  payButton.disabled = false;
  if (answer.payment_status === "failed") return show("failed", `Payment failed: ${answer.error ?? "declined"}`);
  show("ready", "Ready to pay");
}

async function post(path) {
  const response = await fetch(path, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ intent }),
  });
  if (response.status === 503) throw new Error("the backend asks to try again");
  return response.json();
}

// Sent again (same intent) until an answer comes: offline, a dropped connection, a 503.
async function pay() {
  sessionStorage.setItem(PAYING, "1");
  show("paying", "Paying…");
  try {
    render(await post("/api/pay"));
  } catch {
    show("retrying", navigator.onLine ? "Still paying…" : "Offline: paying when the network is back…");
    if (navigator.onLine) setTimeout(pay, 1000);
    else window.addEventListener("online", pay, { once: true });
  }
}

// Every click pays: the backend makes a second one the same payment, so the page need not guard.
payButton.addEventListener("click", pay);

async function load() {
  try {
    const answer = await post("/api/checkout");
    render(answer);
    // Reloaded while paying: take the payment up again (the same keys replay or resume it).
    if (answer.order_status !== "paid" && sessionStorage.getItem(PAYING)) pay();
  } catch {
    show("retrying", "Connecting…");
    setTimeout(load, 1000);
  }
}
load();
