package mysqlstore_test

const helperEnv = "IDEM_MYSQLSTORE_HELPER"

func helperMain() int { return 0 }
