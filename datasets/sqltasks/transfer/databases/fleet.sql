-- The maintenance system of a delivery company's vehicle fleet, in a legacy abbreviated style:
-- depots, vehicles, drivers (with mentors), trips, work orders with the parts they used, fuel cards.
CREATE TABLE depot (depot_id INTEGER PRIMARY KEY, depot_nm VARCHAR NOT NULL, city VARCHAR NOT NULL, opened_dt DATE NOT NULL);
CREATE TABLE vehicle (veh_id INTEGER PRIMARY KEY, reg_no VARCHAR NOT NULL, make VARCHAR NOT NULL, model_yr INTEGER NOT NULL, fuel_type VARCHAR NOT NULL, depot_id INTEGER NOT NULL REFERENCES depot(depot_id), odometer_km INTEGER NOT NULL, retired BOOLEAN NOT NULL);
CREATE TABLE driver (drv_id INTEGER PRIMARY KEY, first_nm VARCHAR NOT NULL, last_nm VARCHAR NOT NULL, license_cls VARCHAR NOT NULL, hire_dt DATE NOT NULL, depot_id INTEGER NOT NULL REFERENCES depot(depot_id), mentor_drv_id INTEGER REFERENCES driver(drv_id));
CREATE TABLE trip (trip_id INTEGER PRIMARY KEY, veh_id INTEGER NOT NULL REFERENCES vehicle(veh_id), drv_id INTEGER NOT NULL REFERENCES driver(drv_id), start_dt DATE NOT NULL, distance_km DECIMAL(8, 1) NOT NULL, fuel_l DECIMAL(6, 1), purpose VARCHAR NOT NULL);
CREATE TABLE work_order (wo_id INTEGER PRIMARY KEY, veh_id INTEGER NOT NULL REFERENCES vehicle(veh_id), opened_dt DATE NOT NULL, closed_dt DATE, wo_type VARCHAR NOT NULL, labor_hrs DECIMAL(5, 1) NOT NULL, total_cost DECIMAL(9, 2) NOT NULL);
CREATE TABLE part (part_id INTEGER PRIMARY KEY, part_no VARCHAR NOT NULL, part_desc VARCHAR NOT NULL, unit_cost DECIMAL(8, 2) NOT NULL);
CREATE TABLE wo_part (wo_id INTEGER NOT NULL REFERENCES work_order(wo_id), part_id INTEGER NOT NULL REFERENCES part(part_id), qty INTEGER NOT NULL, PRIMARY KEY (wo_id, part_id));
CREATE TABLE fuel_card (card_id INTEGER PRIMARY KEY, drv_id INTEGER NOT NULL REFERENCES driver(drv_id), monthly_limit DECIMAL(8, 2) NOT NULL, active BOOLEAN NOT NULL);
INSERT INTO depot VALUES
  (1, 'North Yard', 'Rotterdam', DATE '2012-05-01'),
  (2, 'Harbour Gate', 'Antwerp', DATE '2016-09-12'),
  (3, 'Ring Road', 'Utrecht', DATE '2020-03-23'),
  (4, 'Airport Hub', 'Eindhoven', DATE '2023-07-01');
INSERT INTO vehicle VALUES
  (1, 'VX-201-K', 'Volvo', 2018, 'diesel', 1, 412300, FALSE),
  (2, 'VX-202-K', 'Volvo', 2019, 'diesel', 1, 356010, FALSE),
  (3, 'MB-114-P', 'Mercedes', 2021, 'diesel', 2, 198450, FALSE),
  (4, 'MB-115-P', 'Mercedes', 2022, 'electric', 2, 88120, FALSE),
  (5, 'RN-870-T', 'Renault', 2016, 'diesel', 3, 521900, TRUE),
  (6, 'RN-871-T', 'Renault', 2023, 'electric', 3, 41200, FALSE),
  (7, 'IV-033-B', 'Iveco', 2020, 'cng', 1, 263700, FALSE),
  (8, 'IV-034-B', 'Iveco', 2017, 'cng', 2, 470150, TRUE),
  (9, 'FD-640-L', 'Ford', 2022, 'electric', 4, 63400, FALSE),
  (10, 'FD-641-L', 'Ford', 2024, 'diesel', 4, 12050, FALSE);
INSERT INTO driver VALUES (1, 'Anouk', 'de Vries', 'CE', DATE '2014-02-03', 1, NULL);
INSERT INTO driver VALUES (2, 'Bram', 'Jansen', 'C', DATE '2018-06-11', 1, 1);
INSERT INTO driver VALUES (3, 'Chloé', 'Peeters', 'CE', DATE '2017-01-09', 2, NULL);
INSERT INTO driver VALUES (4, 'Daan', 'Bakker', 'B', DATE '2021-04-19', 3, 1);
INSERT INTO driver VALUES (5, 'Eline', 'Maes', 'C', DATE '2022-08-29', 2, 3);
INSERT INTO driver VALUES (6, 'Finn', 'Visser', 'B', DATE '2023-03-06', 4, 4);
INSERT INTO driver VALUES (7, 'Giulia', 'Rossi', 'CE', DATE '2019-10-14', 3, NULL);
INSERT INTO driver VALUES (8, 'Hamza', 'El Idrissi', 'C', DATE '2024-01-08', 4, 7);
INSERT INTO trip VALUES
  (1, 1, 1, DATE '2024-03-01', 312.5, 98.0, 'delivery'),
  (2, 2, 2, DATE '2024-03-01', 128.0, 41.5, 'delivery'),
  (3, 3, 3, DATE '2024-03-02', 451.2, 140.3, 'delivery'),
  (4, 4, 5, DATE '2024-03-02', 96.4, NULL, 'delivery'),
  (5, 7, 1, DATE '2024-03-04', 210.0, 77.2, 'transfer'),
  (6, 6, 4, DATE '2024-03-04', 64.8, NULL, 'delivery'),
  (7, 9, 6, DATE '2024-03-05', 130.1, NULL, 'pickup'),
  (8, 10, 8, DATE '2024-03-05', 288.9, 81.0, 'delivery'),
  (9, 1, 2, DATE '2024-03-06', 305.3, 95.4, 'delivery'),
  (10, 3, 5, DATE '2024-03-07', 402.7, 121.9, 'transfer'),
  (11, 2, 7, DATE '2024-03-08', 55.0, 19.8, 'workshop'),
  (12, 4, 3, DATE '2024-03-08', 118.6, NULL, 'pickup'),
  (13, 9, 6, DATE '2024-03-09', 141.0, NULL, 'delivery'),
  (14, 7, 2, DATE '2024-03-11', 199.5, 70.1, 'delivery'),
  (15, 10, 8, DATE '2024-03-12', 320.4, 90.7, 'delivery'),
  (16, 6, 7, DATE '2024-03-12', 72.3, NULL, 'pickup');
INSERT INTO work_order VALUES
  (1, 1, DATE '2024-01-10', DATE '2024-01-11', 'service', 3.5, 420.00),
  (2, 5, DATE '2024-01-22', DATE '2024-02-05', 'repair', 18.0, 3150.75),
  (3, 8, DATE '2024-02-01', DATE '2024-02-02', 'inspection', 1.5, 95.00),
  (4, 3, DATE '2024-02-14', DATE '2024-02-15', 'service', 4.0, 510.40),
  (5, 2, DATE '2024-02-20', NULL, 'repair', 6.5, 1280.00),
  (6, 7, DATE '2024-03-03', DATE '2024-03-03', 'recall', 2.0, 0.00),
  (7, 1, DATE '2024-03-15', NULL, 'repair', 9.0, 2240.60),
  (8, 4, DATE '2024-03-18', DATE '2024-03-18', 'inspection', 1.0, 80.00),
  (9, 9, DATE '2024-03-21', DATE '2024-03-22', 'service', 2.5, 260.00),
  (10, 3, DATE '2024-04-02', NULL, 'repair', 12.0, 1875.90);
INSERT INTO part VALUES
  (1, 'BRK-PAD-22', 'front brake pads', 85.50),
  (2, 'OIL-5W30', 'engine oil 5W-30, 5 l', 42.00),
  (3, 'FLT-AIR-9', 'air filter', 27.80),
  (4, 'TYR-315-70', 'truck tyre 315/70', 410.00),
  (5, 'BAT-12V-HD', 'heavy duty battery', 235.00),
  (6, 'WPR-BLD-60', 'wiper blade', 14.90),
  (7, 'CLT-KIT-3', 'clutch kit', 690.00);
INSERT INTO wo_part VALUES
  (1, 2, 2), (1, 3, 1), (2, 1, 4), (2, 4, 2), (4, 2, 2), (4, 3, 1), (5, 5, 1), (7, 1, 2),
  (7, 4, 1), (7, 6, 2), (9, 3, 1), (10, 4, 3), (10, 1, 2);
INSERT INTO fuel_card VALUES
  (1, 1, 1500.00, TRUE), (2, 2, 1200.00, TRUE), (3, 3, 1500.00, TRUE), (4, 5, 900.00, FALSE),
  (5, 7, 1200.00, TRUE), (6, 8, 1000.00, TRUE);
