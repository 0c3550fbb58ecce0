import Portico
