-- wrk script: POST /refunds, partial refunds of 1.00 on succeeded payments (ids in the file
-- PAYMENT_IDS, one per line, each with at least 40.00 left to refund), a fresh key per request.
-- Threads take interleaved slices of the file and go round it, so that consecutive refunds of
-- one payment are as far apart as the list is long (refunds of one payment serialise on its row).
dofile(os.getenv("BENCH_LUA_DIR") .. "/common.lua")

local auth = "Bearer " .. os.getenv("ORDERPAY_KEY")
local payments, counter, prefix = {}, 0, nil
local headers = { ["Authorization"] = auth, ["Content-Type"] = "application/json" }

function init(args)
  payments = read_ids(os.getenv("PAYMENT_IDS"))
  math.randomseed(os.time() * 1000 + thread_id)
  prefix = string.format("refund-%d-%d-%d", os.time(), thread_id, math.random(1, 1000000000))
end

function request()
  counter = counter + 1
  local payment_id = payments[(counter - 1) % #payments + 1]
  headers["Idempotency-Key"] = prefix .. "-" .. counter
  return wrk.format("POST", "/refunds", headers,
    '{"payment_id":"' .. payment_id .. '","amount":"1.00"}')
end

function response(status, response_headers, body)
  count_replay(response_headers)
end
