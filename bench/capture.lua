-- wrk script: manual capture, as pairs. An authorization (POST /payments with capture_method
-- manual on a pre-created order from ORDER_IDS, from line ID_OFFSET on) answers 201 requires_capture; its payment id
-- joins the thread's queue, and the thread's next request captures it (POST
-- /payments/{id}/capture). A thread's connections share the queue, so a pair's two requests may
-- go over different connections. pairs counts the captures that answered 200 succeeded: the
-- harness reports pairs per second.
dofile(os.getenv("BENCH_LUA_DIR") .. "/common.lua")

local auth = "Bearer " .. os.getenv("ORDERPAY_KEY")
local orders, lines, next_order = {}, {}, 1
local authorized, first, last = {}, 1, 0
local headers = { ["Authorization"] = auth, ["Content-Type"] = "application/json" }
local capture_headers = { ["Authorization"] = auth }

function init(args)
  orders, lines = read_ids(os.getenv("ORDER_IDS"))
end

function request()
  if first <= last then
    local payment_id = authorized[first]
    authorized[first] = nil
    first = first + 1
    capture_headers["Idempotency-Key"] = "capture-" .. payment_id
    return wrk.format("POST", "/payments/" .. payment_id .. "/capture", capture_headers, "")
  end
  local order_id = orders[next_order]
  used_upto = math.max(used_upto, lines[next_order])
  next_order = next_order % #orders + 1
  headers["Idempotency-Key"] = "authorize-" .. order_id
  return wrk.format("POST", "/payments", headers,
    '{"order_id":"' .. order_id .. '","payment_method":"pm_card_ok","capture_method":"manual"}')
end

function response(status, response_headers, body)
  count_replay(response_headers)
  if status == 201 and body:find('"requires_capture"', 1, true) then
    local id = body:match('^{"id":"([^"]+)"')
    if id then
      last = last + 1
      authorized[last] = id
    end
  elseif status == 200 and body:find('"succeeded"', 1, true) then
    pairs_done = pairs_done + 1
  end
end
