-- wrk script: POST /payments with pm_card_ok, one payment per pre-created order (ids in the file
-- ORDER_IDS, one per line), key "pay-<order id>". Threads take interleaved slices of the file;
-- a thread that runs out starts over, which replays its earlier payments.
local thread_counter = 0
function setup(thread)
  thread_counter = thread_counter + 1
  thread:set("thread_id", thread_counter)
end

local auth = "Bearer " .. os.getenv("ORDERPAY_KEY")
local orders, next_order = {}, 1
local headers = { ["Authorization"] = auth, ["Content-Type"] = "application/json" }

function init(args)
  local index, threads = 0, tonumber(os.getenv("WRK_THREADS") or "2")
  for line in io.lines(os.getenv("ORDER_IDS")) do
    if index % threads == (thread_id - 1) then
      orders[#orders + 1] = line
    end
    index = index + 1
  end
end

function request()
  local order_id = orders[next_order]
  next_order = next_order % #orders + 1
  headers["Idempotency-Key"] = "pay-" .. order_id
  return wrk.format("POST", "/payments", headers,
    '{"order_id":"' .. order_id .. '","payment_method":"pm_card_ok"}')
end

function done(summary, latency, requests)
  local errors = summary.errors
  io.write(string.format(
    'WRK_RESULT {"requests":%d,"duration_us":%d,"p50_us":%d,"p99_us":%d,"errors":%d}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    errors.connect + errors.read + errors.write + errors.status + errors.timeout))
end
