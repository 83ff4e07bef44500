-- wrk script: POST /payments with pm_card_ok, one payment per pre-created order (ids in the file
-- ORDER_IDS, one per line, from line ID_OFFSET on), key "pay-<order id>". Threads take
-- interleaved slices of the file; a thread that runs out starts over, which replays its earlier
-- payments: the harness preloads enough orders that none does, and counts replays to prove it.
dofile(os.getenv("BENCH_LUA_DIR") .. "/common.lua")

local auth = "Bearer " .. os.getenv("ORDERPAY_KEY")
local orders, lines, next_order = {}, {}, 1
local headers = { ["Authorization"] = auth, ["Content-Type"] = "application/json" }

function init(args)
  orders, lines = read_ids(os.getenv("ORDER_IDS"))
end

function request()
  local order_id = orders[next_order]
  used_upto = math.max(used_upto, lines[next_order])
  next_order = next_order % #orders + 1
  headers["Idempotency-Key"] = "pay-" .. order_id
  return wrk.format("POST", "/payments", headers,
    '{"order_id":"' .. order_id .. '","payment_method":"pm_card_ok"}')
end

function response(status, response_headers, body)
  count_replay(response_headers)
end
