print("portico")
